//! `rackwire bench vnic --mtu LIST`: Marlin's Fig. 8, TCP and UDP throughput over the virtual
//! NIC against the MTU, beside the same over a veth with the same MTU.
//!
//! For each MTU a rack of two hosts in one memory domain (rw0 between them rides shared
//! memory, as Marlin's EOP rides its PCIe fabric) with one unshaped rail at that MTU; rw0's
//! MTU is set to it in both hosts (`ip link set rw0 mtu`, as an administrator would). Then, each
//! repeat, the order rotated: iperf3 TCP (131072-byte writes) and UDP (datagrams of the MTU less
//! the IP and UDP headers, so each is one packet, at the highest rate with at most 1% lost) over
//! rw0 and over the veth. The kernel hands both devices TCP's segments of up to 64 KiB whatever
//! the MTU (segmentation offload), so TCP's rate moves little with it; each UDP datagram is a
//! packet of its own, so UDP's rate is per-packet work against the MTU, the figure's point.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rackwire_rack::RackConfig;

use crate::repeat::median_spread;
use crate::vnic::{give_hosts_cores, plain_addr, route_dev};
use crate::{iperf3_path, iperf3_udp_capacity, NetPath, Row, UdpSearch};

/// iperf3's TCP write length.
const TCP_WRITE: u64 = 131_072;
/// Bytes of the IPv4 and UDP headers: a datagram of the MTU less these is one packet.
const IP_UDP_HEADERS: u64 = 28;
/// The smallest MTU swept (IPv6's minimum; below it the rows say little).
pub const MTU_MIN: usize = 1280;
/// The largest: rw0's own MTU.
pub const MTU_MAX: usize = rackwire_vnic::VNIC_MTU;
/// MTUs in one sweep at most.
pub const MTUS_MAX: usize = 16;
/// Repeats at most.
const REPEAT_MAX: usize = 20;
/// The rack's name.
const RACK: &str = "bvmtu";
/// The four rows of one MTU, in the order of a repeat's first pass.
const ROWS: [&str; 4] = ["vnic-tcp", "veth-tcp", "vnic-udp", "veth-udp"];

/// The UDP search for datagrams of `size` bytes: large ones from the same first rate as the
/// other large-datagram rows, with two probes more (the veth carries up to 32 Gbit/s of them
/// here: doubling takes four probes to pass it, and the rest narrow the last gap); an Ethernet
/// frame's from a quarter of that (some 85,000 a second), so the probes go where the rates are.
fn udp_search(size: u64) -> UdpSearch {
    if size >= 8_000 {
        UdpSearch { first_rate: crate::UDP_SEARCH_LARGE.first_rate, probes: crate::UDP_SEARCH_LARGE.probes + 2 }
    } else {
        UdpSearch { first_rate: 1e9, probes: 6 }
    }
}

/// The rack of one MTU: two hosts sharing memory, one unshaped rail.
fn config(mtu: usize) -> String {
    format!("name = \"{RACK}\"\n[[rail]]\nmtu = {mtu}\n[[host]]\nname = \"h1\"\n[[host]]\nname = \"h2\"\n")
}

/// One MTU's figures: per row, each repeat's MB/s.
struct Swept {
    mtu: usize,
    runs: Vec<Vec<f64>>,
    notes: Vec<String>,
}

/// Bring up the rack at `mtu`, set rw0's MTU, and measure the rows `repeat` times.
fn sweep_one(mtu: usize, repeat: usize, secs: u64, host_cores: bool) -> Result<Swept> {
    let mut cfg = RackConfig::parse(&config(mtu))?;
    if host_cores {
        give_hosts_cores(&mut cfg)?;
    }
    let _ = rackwire_rack::down(Some(RACK));
    let state = rackwire_rack::up(&cfg, &crate::spawn::own_exe()?)?;
    let _down = rackwire_rack::DownOnDrop(RACK.into());
    let (h1, h2) = (state.host("h1")?.clone(), state.host("h2")?.clone());
    for (i, h) in [&h1, &h2].iter().enumerate() {
        rackwire_vnic::ip(&["-n", &h.ns, "addr", "add", &format!("{}/24", plain_addr(i, 0)), "dev", "eth0"])?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while route_dev(&h1.ns, "198.18.0.2") != "rw0" || route_dev(&h2.ns, "198.18.0.1") != "rw0" {
        if Instant::now() > deadline {
            bail!("the agents did not route each other over rw0 within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for h in [&h1, &h2] {
        rackwire_vnic::ip(&["-n", &h.ns, "link", "set", "dev", rackwire_vnic::VNIC_NAME, "mtu", &mtu.to_string()])?;
    }
    let path = |addr: String| NetPath {
        server_ns: Some(h2.ns.clone()),
        client_ns: Some(h1.ns.clone()),
        addr,
        server_cores: h2.cores.clone(),
        client_cores: h1.cores.clone(),
    };
    let (vnic, veth) = (path("198.18.0.2".into()), path(plain_addr(1, 0)));
    let datagram = mtu as u64 - IP_UDP_HEADERS;
    let udp_secs = (secs / 2).max(1);
    let measure = |row: &str| -> Result<Row, String> {
        match row {
            "vnic-tcp" => iperf3_path(&vnic, TCP_WRITE, secs, row),
            "veth-tcp" => iperf3_path(&veth, TCP_WRITE, secs, row),
            "vnic-udp" => iperf3_udp_capacity(&vnic, datagram, udp_secs, udp_search(datagram), row),
            _ => iperf3_udp_capacity(&veth, datagram, udp_secs, udp_search(datagram), row),
        }
    };
    let mut swept = Swept { mtu, runs: vec![Vec::new(); ROWS.len()], notes: Vec::new() };
    for rep in 0..repeat {
        for k in 0..ROWS.len() {
            let i = (k + rep) % ROWS.len();
            match measure(ROWS[i]).map(|r| r.mb_per_s) {
                Ok(Some(mbs)) => swept.runs[i].push(mbs),
                Ok(None) => swept.notes.push(format!("MTU {mtu}, {} (run {}): no rate", ROWS[i], rep + 1)),
                Err(e) => swept.notes.push(format!("MTU {mtu}, {} (run {}): {e}", ROWS[i], rep + 1)),
            }
        }
    }
    Ok(swept)
}

/// The median of each repeat's ratio of row `ours` to row `theirs` (both measured), with the
/// spread.
fn ratio(s: &Swept, ours: usize, theirs: usize) -> Option<(f64, f64, f64)> {
    let mut v: Vec<f64> =
        s.runs[ours].iter().zip(&s.runs[theirs]).filter(|(_, b)| **b > 0.0).map(|(a, b)| a / b).collect();
    (!v.is_empty()).then(|| median_spread(&mut v))
}

/// Megabytes a second as gigabits a second (Marlin's unit).
fn gbit(mb_s: f64) -> f64 {
    mb_s * 8.0 / 1000.0
}

/// `rackwire bench vnic --mtu LIST`.
pub fn run(mtus: &[usize], repeat: usize, scale: f64, host_cores: bool, json: bool) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("`rackwire bench vnic` builds a virtual rack: it needs root");
    }
    if mtus.is_empty() || mtus.len() > MTUS_MAX {
        bail!("--mtu: 1..={MTUS_MAX} MTUs");
    }
    if let Some(m) = mtus.iter().find(|m| !(MTU_MIN..=MTU_MAX).contains(m)) {
        bail!("--mtu {m}: each must be {MTU_MIN}..={MTU_MAX} (rw0's own)");
    }
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    if std::process::Command::new("iperf3").arg("--version").output().is_err() {
        bail!("iperf3 is not installed (apt-get install iperf3)");
    }
    let secs = ((5.0 * scale).round() as u64).clamp(1, 30);
    let mut all = Vec::new();
    for &mtu in mtus {
        if !json {
            eprintln!("measuring at MTU {mtu} ({repeat} repeats) ...");
        }
        all.push(sweep_one(mtu, repeat, secs, host_cores)?);
    }
    let cell = |s: &Swept, i: usize| {
        let mut v = s.runs[i].clone();
        (!v.is_empty()).then(|| median_spread(&mut v))
    };
    if json {
        let rows: Vec<_> = all
            .iter()
            .map(|s| {
                let mut o = serde_json::Map::new();
                o.insert("mtu".into(), s.mtu.into());
                for (i, name) in ROWS.iter().enumerate() {
                    if let Some((m, lo, hi)) = cell(s, i) {
                        o.insert(format!("{name}_mb_s"), serde_json::json!({ "median": m, "lo": lo, "hi": hi }));
                    }
                }
                for (name, (a, b)) in [("tcp_vnic_over_veth", (0, 1)), ("udp_vnic_over_veth", (2, 3))] {
                    if let Some((m, lo, hi)) = ratio(s, a, b) {
                        o.insert(name.into(), serde_json::json!({ "median": m, "lo": lo, "hi": hi }));
                    }
                }
                o.insert("notes".into(), s.notes.clone().into());
                serde_json::Value::Object(o)
            })
            .collect();
        let doc = serde_json::json!({ "rows": rows, "meta": { "repeats": repeat, "seconds_per_run": secs, "host_cores": host_cores } });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let fmt = |c: Option<(f64, f64, f64)>| {
        c.map_or("-".to_string(), |(m, lo, hi)| format!("{:.2} ({:.2}–{:.2})", gbit(m), gbit(lo), gbit(hi)))
    };
    let fmt_ratio =
        |c: Option<(f64, f64, f64)>| c.map_or("-".to_string(), |(m, lo, hi)| format!("{m:.2} ({lo:.2}–{hi:.2})"));
    let mut t = crate::table();
    t.set_header(["MTU", "TCP rw0, Gbit/s", "TCP veth", "rw0 / veth", "UDP rw0, Gbit/s", "UDP veth", "rw0 / veth"]);
    for s in &all {
        t.add_row([
            s.mtu.to_string(),
            fmt(cell(s, 0)),
            fmt(cell(s, 1)),
            fmt_ratio(ratio(s, 0, 1)),
            fmt(cell(s, 2)),
            fmt(cell(s, 3)),
            fmt_ratio(ratio(s, 2, 3)),
        ]);
    }
    println!("{t}");
    println!(
        "(two hosts sharing memory, rw0 and the veth both at each MTU; {repeat} repeats, rows rotated; UDP: datagrams of the MTU less 28 bytes at the highest rate with at most 1% lost; median (spread))"
    );
    for s in &all {
        for n in &s.notes {
            println!("note: {n}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the per-MTU rack description parses as the rack it means (two hosts sharing
    // memory, one unshaped rail at the MTU), at both ends of the swept range, and that a
    // datagram of the MTU less the headers is what one packet of that MTU carries.
    #[test]
    fn each_mtu_gets_its_rack() {
        for mtu in [MTU_MIN, 9000, MTU_MAX] {
            let c = RackConfig::parse(&config(mtu)).unwrap();
            assert_eq!(c.rails.len(), 1);
            assert_eq!(c.rails[0].mtu as usize, mtu);
            assert_eq!(c.hosts.len(), 2);
            assert_eq!(c.frame_max() as u64, mtu as u64 - IP_UDP_HEADERS);
        }
        assert_eq!(udp_search(1472).probes, 6);
        assert_eq!(udp_search(65_492).first_rate, crate::UDP_SEARCH_LARGE.first_rate);
    }
}
