//! The rack description (TOML).
//!
//! ```toml
//! name = "r2l1g"        # short: it prefixes the namespaces
//! mh = "h1"             # host that runs the management host (default: the first local host)
//!
//! [[rail]]              # one switch each; every host has one link per rail
//! rate = "1gbit"        # tc tbf rate of each link, both directions (omit: unshaped)
//! mtu = 1500
//!
//! [[host]]
//! name = "h1"
//! cores = [0]           # its programs run on these cores only (default: any)
//! [[host]]
//! name = "h2"
//! domain = "b"          # another rack: no shared memory with the others, edge transport only
//! [[host]]
//! name = "far"
//! remote = true         # a plain host on the Ethernet only: no fabric agent, no rw0
//! ```

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::cores::{CORES_PER_HOST_MAX, CORE_MAX};
use crate::RackError;

/// Hosts in one rack at most.
pub const HOSTS_MAX: usize = 32;
/// Rails (links per host) at most.
pub const RAILS_MAX: usize = 4;
/// Longest rack name.
pub const RACK_NAME_MAX: usize = 8;
/// Longest host name.
pub const HOST_NAME_MAX: usize = 8;
/// Smallest and largest link MTU.
pub const MTU_RANGE: (u32, u32) = (576, 65_535);

/// A rack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RackConfig {
    /// Rack name.
    pub name: String,
    /// Host that runs the management host.
    #[serde(default)]
    pub mh: Option<String>,
    /// Rails.
    #[serde(rename = "rail", default)]
    pub rails: Vec<RailConfig>,
    /// Hosts.
    #[serde(rename = "host", default)]
    pub hosts: Vec<HostConfig>,
}

/// One rail: a switch, and a link from every host to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RailConfig {
    /// Rate of each link (`tc` syntax: `1gbit`, `10gbit`, `500mbit`); none: unshaped.
    #[serde(default)]
    pub rate: Option<String>,
    /// Link MTU.
    #[serde(default = "default_mtu")]
    pub mtu: u32,
}

fn default_mtu() -> u32 {
    1500
}

/// One host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    /// Host name.
    pub name: String,
    /// A plain Ethernet host: no node agent, no virtual NIC.
    #[serde(default)]
    pub remote: bool,
    /// Memory domain: hosts of one domain share memory (one rack); default `rack`.
    #[serde(default)]
    pub domain: Option<String>,
    /// Run the virtual NIC `rw0` in this host's agent.
    #[serde(default = "yes")]
    pub vnic: bool,
    /// The cores its agent and programs run on (see [`crate::cores`]); empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cores: Vec<usize>,
}

fn yes() -> bool {
    true
}

/// A host's cores: at most [`CORES_PER_HOST_MAX`], each at most [`CORE_MAX`], none twice.
/// (Whether this machine has them is checked when the rack comes up.)
fn check_cores(h: &HostConfig) -> Result<(), RackError> {
    if h.cores.len() > CORES_PER_HOST_MAX {
        return Err(RackError::Config(format!("host {:?}: at most {CORES_PER_HOST_MAX} cores", h.name)));
    }
    let mut seen = std::collections::HashSet::new();
    for &c in &h.cores {
        if c > CORE_MAX {
            return Err(RackError::Config(format!("host {:?}: core {c} is above {CORE_MAX}", h.name)));
        }
        if !seen.insert(c) {
            return Err(RackError::Config(format!("host {:?}: core {c} listed twice", h.name)));
        }
    }
    Ok(())
}

fn short_name(what: &str, s: &str, max: usize) -> Result<(), RackError> {
    if s.is_empty() || s.len() > max || !s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return Err(RackError::Config(format!("{what} {s:?}: 1 to {max} lower-case letters or digits")));
    }
    Ok(())
}

/// Bytes per second in a `tc` rate (`1gbit`, `100mbit`, `10gbit`, `800kbit`, `1000000bit`).
pub fn rate_bytes_per_s(rate: &str) -> Option<u64> {
    let r = rate.trim().to_ascii_lowercase();
    let (num, mult) = [("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)]
        .iter()
        .find_map(|(suffix, m)| r.strip_suffix(suffix).map(|n| (n.to_string(), *m)))?;
    let v: f64 = num.parse().ok()?;
    (v > 0.0 && v.is_finite()).then(|| (v * mult / 8.0) as u64).filter(|&b| b > 0)
}

impl RackConfig {
    /// Parse and check.
    pub fn parse(text: &str) -> Result<RackConfig, RackError> {
        let c: RackConfig = toml::from_str(text).map_err(|e| RackError::Config(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// Check names, limits, rates and the management host.
    pub fn validate(&self) -> Result<(), RackError> {
        short_name("rack name", &self.name, RACK_NAME_MAX)?;
        if !(1..=RAILS_MAX).contains(&self.rails.len()) {
            return Err(RackError::Config(format!("a rack needs 1 to {RAILS_MAX} rails ([[rail]] tables)")));
        }
        if !(2..=HOSTS_MAX).contains(&self.hosts.len()) {
            return Err(RackError::Config(format!("a rack needs 2 to {HOSTS_MAX} hosts ([[host]] tables)")));
        }
        for (k, r) in self.rails.iter().enumerate() {
            if !(MTU_RANGE.0..=MTU_RANGE.1).contains(&r.mtu) {
                return Err(RackError::Config(format!(
                    "rail {k}: MTU {} outside {}..={}",
                    r.mtu, MTU_RANGE.0, MTU_RANGE.1
                )));
            }
            if let Some(rate) = &r.rate {
                if rate_bytes_per_s(rate).is_none() {
                    return Err(RackError::Config(format!(
                        "rail {k}: rate {rate:?}: use a number with gbit, mbit or kbit"
                    )));
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        for h in &self.hosts {
            short_name("host name", &h.name, HOST_NAME_MAX)?;
            if h.name == "sw" {
                return Err(RackError::Config("host name \"sw\" is taken by the switches".into()));
            }
            if !seen.insert(&h.name) {
                return Err(RackError::Config(format!("host {:?} appears twice", h.name)));
            }
            if let Some(d) = &h.domain {
                short_name("memory domain", d, 16)?;
            }
            check_cores(h)?;
        }
        let mh = self.mh_host()?;
        if mh.remote {
            return Err(RackError::Config(format!("the management host cannot run on remote host {:?}", mh.name)));
        }
        Ok(())
    }

    /// The host that runs the management host.
    pub fn mh_host(&self) -> Result<&HostConfig, RackError> {
        match &self.mh {
            Some(n) => self
                .hosts
                .iter()
                .find(|h| &h.name == n)
                .ok_or_else(|| RackError::Config(format!("mh = {n:?}: no such host"))),
            None => {
                self.hosts.iter().find(|h| !h.remote).ok_or_else(|| RackError::Config("every host is remote".into()))
            }
        }
    }

    /// The largest edge-transport frame every rail carries whole: the smallest rail MTU less
    /// the IPv4 and UDP headers.
    pub fn frame_max(&self) -> u32 {
        self.rails.iter().map(|r| r.mtu).min().unwrap_or(1500).saturating_sub(28)
    }

    /// The management host's own address (rail 0, beside its host's).
    pub fn mh_addr() -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, 250)
    }

    /// Address of host `i` on rail `k`.
    pub fn addr(i: usize, k: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, k as u8, i as u8 + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "t1"
[[rail]]
rate = "1gbit"
[[rail]]
mtu = 9000
[[host]]
name = "a"
[[host]]
name = "b"
remote = true
"#;

    // Checks a well-formed rack parses with its defaults (MTU 1500, vnic on, first local host
    // runs the management host, no cores: any), a host's cores as given, and the rate
    // parser's units.
    #[test]
    fn parses_with_defaults() {
        let c = RackConfig::parse(GOOD).unwrap();
        assert_eq!(c.rails[0].mtu, 1500);
        assert_eq!(c.rails[1].rate, None);
        assert!(c.hosts[0].vnic && c.hosts[1].remote);
        assert!(c.hosts[0].cores.is_empty(), "no cores given: any");
        let pinned = RackConfig::parse(&GOOD.replace("name = \"a\"", "name = \"a\"\ncores = [0, 2]")).unwrap();
        assert_eq!(pinned.hosts[0].cores, [0, 2]);
        assert_eq!(c.mh_host().unwrap().name, "a");
        assert_eq!(rate_bytes_per_s("1gbit"), Some(125_000_000));
        assert_eq!(rate_bytes_per_s("10Gbit"), Some(1_250_000_000));
        assert_eq!(rate_bytes_per_s("500mbit"), Some(62_500_000));
        assert_eq!(rate_bytes_per_s("fast"), None);
        assert_eq!(RackConfig::addr(2, 1), Ipv4Addr::new(198, 18, 1, 3));
    }

    // Checks that each kind of bad rack is refused with a message naming what is wrong.
    #[test]
    fn bad_racks_are_refused() {
        let cases = [
            (GOOD.replace("name = \"t1\"", "name = \"Too-Long-Name\""), "rack name"),
            (GOOD.replace("name = \"b\"", "name = \"a\""), "twice"),
            (GOOD.replace("rate = \"1gbit\"", "rate = \"quick\""), "rate"),
            (GOOD.replace("mtu = 9000", "mtu = 100"), "MTU"),
            (GOOD.replace("name = \"t1\"", "name = \"t1\"\nmh = \"b\""), "remote"),
            (GOOD.replace("name = \"t1\"", "name = \"t1\"\nmh = \"zz\""), "no such host"),
            (GOOD.replace("remote = true", "colour = 1"), "colour"),
            (GOOD.replace("name = \"a\"", "name = \"a\"\ncores = [1, 1]"), "listed twice"),
            (GOOD.replace("name = \"a\"", "name = \"a\"\ncores = [99999]"), "above"),
            (GOOD.replace("name = \"a\"", "name = \"a\"\ncores = [-1]"), "cores"),
        ];
        for (text, want) in cases {
            let e = RackConfig::parse(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{e:?} should mention {want:?}");
        }
    }
}
