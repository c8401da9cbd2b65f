//! `rackwire doctor`: checks this host for what rackwire needs and says what to fix, each
//! finding with the command that fixes it. Read-only: it changes nothing on the host.
//!
//! The checks: the configuration file; the secret file's mode; the state folder's owner; the TUN
//! device (for rw0); reverse-path filtering on the links and rw0; the socket buffer limits the
//! edge transport asks for; each link's address and its interface's MTU against `link_mtu`; the
//! links' ports and the management host's (free, or held by rackwire itself); shared memory
//! (memfd); and, when the management host answers, the secret it takes, the clock against its
//! clock, and every other node's links reached over the edge transport.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use rackwire::FabricConfig;

use crate::holder::Proto;
use serde::Serialize;

/// IPv4 and UDP headers: a link's frames are its interface's MTU less these.
const IP_UDP_HEADER_BYTES: usize = 28;
/// A clock further than this from the management host's is reported.
const CLOCK_SKEW_MAX: Duration = Duration::from_secs(2);
/// How long the probe of another node's links may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// Nodes probed at most (the first ones the management host lists).
const PROBE_NODES_MAX: usize = 64;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    Ok,
    /// Works, but not as well as it could, or could not be checked.
    Warn,
    /// Will not work until fixed.
    Fail,
}

/// One finding.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Finding {
    pub check: &'static str,
    pub status: Status,
    pub what: String,
    /// The command (or edit) that fixes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn ok(check: &'static str, what: impl Into<String>) -> Finding {
    Finding { check, status: Status::Ok, what: what.into(), fix: None }
}

fn warn(check: &'static str, what: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding { check, status: Status::Warn, what: what.into(), fix: Some(fix.into()) }
}

fn fail(check: &'static str, what: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding { check, status: Status::Fail, what: what.into(), fix: Some(fix.into()) }
}

/// Where the host's kernel settings and devices are read (the real ones, or a test's copy).
pub(crate) struct Host {
    /// `/proc/sys` (or a folder laid out like it).
    pub proc_sys: PathBuf,
    /// `/sys/class/net`.
    pub class_net: PathBuf,
    /// `/dev/net/tun`.
    pub tun: PathBuf,
}

impl Host {
    pub(crate) fn real() -> Host {
        Host { proc_sys: "/proc/sys".into(), class_net: "/sys/class/net".into(), tun: "/dev/net/tun".into() }
    }

    fn sysctl(&self, key: &str) -> Option<String> {
        std::fs::read_to_string(self.proc_sys.join(key.replace('.', "/"))).ok().map(|s| s.trim().to_string())
    }

    fn sysctl_num(&self, key: &str) -> Option<u64> {
        self.sysctl(key).and_then(|v| v.parse().ok())
    }
}

/// The interfaces of this host and their IPv4 addresses (`ip -o -4 addr show`).
fn interfaces_v4() -> Vec<(String, std::net::Ipv4Addr)> {
    let Ok(o) = std::process::Command::new("ip").args(["-o", "-4", "addr", "show"]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = f.get(1)?.trim_end_matches(':').split('@').next()?.to_string();
            let at = f.iter().position(|w| *w == "inet")?;
            let ip = f.get(at + 1)?.split('/').next()?.parse().ok()?;
            Some((name, ip))
        })
        .collect()
}

/// The configuration file: it loads and passes its check.
fn check_config(path: Option<&Path>) -> (Vec<Finding>, Option<FabricConfig>) {
    const C: &str = "configuration";
    let Some(path) = path else {
        let f = warn(
            C,
            format!("no configuration file (RACKWIRE_CONFIG unset, {} missing)", rackwire::CONFIG_PATH_DEFAULT),
            format!("write {} (see `rackwire config reference`)", rackwire::CONFIG_PATH_DEFAULT),
        );
        return (vec![f], FabricConfig::from_env().ok());
    };
    let shown = path.display();
    match FabricConfig::check_file(path) {
        Ok(()) => {}
        Err(problems) => {
            let fix = format!("edit {shown}, then `rackwire config check {shown}`");
            let found = problems.into_iter().map(|p| fail(C, p, fix.clone())).collect();
            return (found, None);
        }
    }
    match FabricConfig::from_env().and_then(|c| c.validate().map(|()| c)) {
        Ok(c) => (vec![ok(C, format!("{shown} loads, with the environment over it"))], Some(c)),
        Err(e) => {
            (vec![fail(C, format!("{shown} with the environment over it: {e}"), "fix the RACKWIRE_* variables")], None)
        }
    }
}

/// The secret file and the state folder: this user's alone.
fn check_files(file: Option<&Path>, cfg: Option<&FabricConfig>) -> Vec<Finding> {
    let mut out = Vec::new();
    let secret_file = std::env::var_os(rackwire::vars::SECRET_FILE).map(PathBuf::from).or_else(|| {
        let text = std::fs::read_to_string(file?).ok()?;
        let t: toml::Table = toml::from_str(&text).ok()?;
        t.get("secret_file")?.as_str().map(PathBuf::from)
    });
    if let Some(p) = secret_file {
        out.push(match rackwire_mh::owner_only::check_file(&p) {
            Ok(()) => ok("secret file", format!("{} is its owner's alone", p.display())),
            Err(e) => fail("secret file", e.to_string(), format!("chown root: {0} && chmod 600 {0}", p.display())),
        });
    }
    if let Some(dir) = cfg.and_then(|c| c.state_dir.clone()) {
        if dir.exists() {
            out.push(match rackwire_mh::owner_only::check_folder(&dir, rackwire_mh::owner_only::Reach::Private) {
                Ok(()) => ok("state folder", format!("{} is this user's alone", dir.display())),
                Err(e) => {
                    fail("state folder", e.to_string(), format!("chown $(id -u) {0} && chmod 700 {0}", dir.display()))
                }
            });
        }
    }
    out
}

/// The kernel's side: TUN for rw0, reverse-path filtering, socket buffers, shared memory.
fn check_kernel(host: &Host, cfg: Option<&FabricConfig>) -> Vec<Finding> {
    let mut out = Vec::new();
    use std::os::unix::fs::FileTypeExt;
    let tun = std::fs::metadata(&host.tun).map(|m| m.file_type().is_char_device()).unwrap_or(false);
    out.push(if tun {
        ok("tun", format!("{} is there (for rw0)", host.tun.display()))
    } else {
        warn("tun", format!("no {}: the agent cannot make rw0", host.tun.display()), "modprobe tun")
    });
    // The kernel filters by the larger of `all` and the interface's value (0 off, 1 strict,
    // 2 loose). Strict on `all` holds for rw0 whatever the agent sets there: rw0 then drops
    // what a peer sends from its link address before the route back through rw0 is in. Strict
    // on a link drops that link's frames whenever the route back to their source leaves by
    // another interface (links of one subnet on several ports, asymmetric routes): striping
    // over the rails stalls on it.
    let all = host.sysctl_num("net.ipv4.conf.all.rp_filter").unwrap_or(0);
    let mut strict: Vec<(String, &str)> = Vec::new();
    if all == 1 {
        strict.push(("all".into(), "rw0 drops its peers' packets"));
    }
    for (ifname, _) in link_interfaces(cfg) {
        let own = host.sysctl_num(&format!("net.ipv4.conf.{ifname}.rp_filter")).unwrap_or(0);
        if all.max(own) == 1 && own == 1 {
            strict.push((ifname, "a link's frames routed back by another port are dropped"));
        }
    }
    out.push(if strict.is_empty() {
        ok("rp_filter", "no strict reverse-path filtering on the links or rw0")
    } else {
        let fix = strict
            .iter()
            .map(|(i, _)| format!("sysctl -w net.ipv4.conf.{i}.rp_filter=2"))
            .collect::<Vec<_>>()
            .join(" && ");
        let what = strict.iter().map(|(i, why)| format!("{i} ({why})")).collect::<Vec<_>>().join(", ");
        fail("rp_filter", format!("strict reverse-path filtering (1) on {what}"), fix)
    });
    let want = rackwire_udp::SOCKET_BUFFER_BYTES as u64;
    let low: Vec<String> = ["net.core.rmem_max", "net.core.wmem_max"]
        .into_iter()
        .filter(|k| host.sysctl_num(k).is_some_and(|v| v < want))
        .map(String::from)
        .collect();
    out.push(if low.is_empty() {
        ok("socket buffers", format!("the links' sockets may have {} MiB each way", want >> 20))
    } else {
        warn(
            "socket buffers",
            format!(
                "{} below {} MiB: a program without CAP_NET_ADMIN gets smaller link buffers (losses at line rate)",
                low.join(", "),
                want >> 20
            ),
            low.iter().map(|k| format!("sysctl -w {k}={want}")).collect::<Vec<_>>().join(" && "),
        )
    });
    let memfd = rustix::fs::memfd_create("rackwire-doctor", rustix::fs::MemfdFlags::CLOEXEC)
        .and_then(|fd| rustix::fs::ftruncate(&fd, 4096));
    out.push(match memfd {
        Ok(()) => ok("shared memory", "memfd regions can be made"),
        Err(e) => fail(
            "shared memory",
            format!("cannot make a memfd region: {e}"),
            "check vm.memfd_noexec and the seccomp policy",
        ),
    });
    out
}

/// The interfaces of the configured links, with each link's address.
fn link_interfaces(cfg: Option<&FabricConfig>) -> Vec<(String, SocketAddr)> {
    let Some(cfg) = cfg else { return Vec::new() };
    let ifs = interfaces_v4();
    cfg.links
        .iter()
        .filter_map(|l| l.parse::<SocketAddr>().ok())
        .filter_map(|a| ifs.iter().find(|(_, ip)| std::net::IpAddr::V4(*ip) == a.ip()).map(|(n, _)| (n.clone(), a)))
        .collect()
}

/// Each link: its address is this host's, its port is free, its interface's MTU carries
/// `link_mtu`-byte frames.
fn check_links(host: &Host, cfg: &FabricConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    if cfg.links.is_empty() {
        out.push(ok("links", "no links: this host reaches only peers that share its memory"));
        return out;
    }
    let ifs = link_interfaces(Some(cfg));
    for l in &cfg.links {
        let Ok(addr) = l.parse::<SocketAddr>() else {
            out.push(fail("links", format!("link {l:?} is not ip:port"), "write links as [\"198.18.1.2:7710\", ...]"));
            continue;
        };
        let Some((ifname, _)) = ifs.iter().find(|(_, a)| *a == addr) else {
            out.push(fail(
                "links",
                format!("{} is not an address of this host", addr.ip()),
                format!("ip addr add {}/24 dev IFACE (or fix `links`)", addr.ip()),
            ));
            continue;
        };
        if addr.port() != 0 {
            out.push(match UdpSocket::bind(addr) {
                Ok(_) => ok("ports", format!("{addr} is free")),
                Err(e) => port_held(Proto::Udp, addr, &e, "give this link another port (or 0)"),
            });
        }
        // The largest frame the interface carries, within what a link takes.
        let best = |m: usize| (m - IP_UDP_HEADER_BYTES).min(rackwire_udp::UDP_PAYLOAD_MAX);
        let mtu: Option<usize> =
            std::fs::read_to_string(host.class_net.join(ifname).join("mtu")).ok().and_then(|s| s.trim().parse().ok());
        out.push(match mtu {
            Some(m) if m < cfg.link_mtu + IP_UDP_HEADER_BYTES => fail(
                "mtu",
                format!("{ifname} has MTU {m}: frames of {} bytes (link_mtu) do not fit", cfg.link_mtu),
                format!(
                    "ip link set dev {ifname} mtu {} (or link_mtu = {})",
                    cfg.link_mtu + IP_UDP_HEADER_BYTES,
                    m - IP_UDP_HEADER_BYTES
                ),
            ),
            Some(m) if best(m) > cfg.link_mtu => warn(
                "mtu",
                format!(
                    "{ifname} carries MTU {m}, link_mtu uses {}: larger frames would cost less per byte",
                    cfg.link_mtu + IP_UDP_HEADER_BYTES
                ),
                format!("link_mtu = {} (on every host of the rail)", best(m)),
            ),
            Some(m) => ok("mtu", format!("{ifname} (MTU {m}) carries {}-byte frames", cfg.link_mtu)),
            None => warn("mtu", format!("cannot read {ifname}'s MTU"), format!("ip link show {ifname}")),
        });
    }
    out
}

/// A port that could not be bound: fine when rackwire holds it (its service runs), else who
/// does and the fix.
fn port_held(proto: Proto, addr: SocketAddr, e: &std::io::Error, fix: &str) -> Finding {
    match crate::holder::holder(proto, addr) {
        Some(h) if h.comm == "rackwire" => {
            ok("ports", format!("{addr} is held by rackwire (pid {}), as it should", h.pid))
        }
        Some(h) => fail(
            "ports",
            format!("{addr} is held by {} (pid {})", h.comm, h.pid),
            format!("stop {} (kill {}), or {fix}", h.comm, h.pid),
        ),
        None => fail("ports", format!("{addr}: {e}"), format!("ss -lpn 'sport = :{}'; or {fix}", addr.port())),
    }
}

/// The management host this host runs (its file's `[management_host]`): its address is this
/// host's, and its port is free or held by the management host itself.
fn check_mh_listen(file: &Path) -> Vec<Finding> {
    let table = match rackwire::ManagementHostFile::read(file) {
        Ok(t) => t,
        Err(_) => return Vec::new(), // the configuration check said why
    };
    let Some(listen) = table.listen else { return Vec::new() };
    let Ok(addr) = listen.parse::<SocketAddr>() else {
        return vec![fail(
            "ports",
            format!("[management_host] listen = {listen:?} is not ip:port"),
            "listen = \"198.18.0.1:7700\"",
        )];
    };
    vec![match std::net::TcpListener::bind(addr) {
        Ok(_) => ok("ports", format!("{addr} is free for the management host")),
        // One file for every host may name the management host's address: it runs elsewhere.
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
            ok("ports", format!("the management host listens on {addr}, another host's address"))
        }
        Err(e) => port_held(Proto::Tcp, addr, &e, "give the management host another port"),
    }]
}

/// The management host: it answers and takes the secret; the clock against its clock; every
/// other node's links reached over the edge transport.
fn check_fabric(cfg: &FabricConfig) -> Vec<Finding> {
    let mut out = Vec::new();
    if cfg.mh.is_empty() {
        out.push(fail(
            "management host",
            "none configured",
            "mh = \"HOST:7700\" in the configuration file (or RACKWIRE_MH)",
        ));
        return out;
    }
    let observer = rackwire_mh::MhClient::join(rackwire_mh::MhConfig {
        addr: cfg.mh.clone(),
        secret: cfg.secret.clone(),
        name: "rackwire-doctor".into(),
        role: rackwire_mh::Role::Observer,
        trust: rackwire_mh::MhTrust::Secret,
        transient: false,
    });
    let answered = observer.and_then(|o| Ok((o.nodes()?, o.clock_offset_ms()?)));
    let (nodes, offset) = match answered {
        Ok(n) => {
            out.push(ok("management host", format!("{} answers and takes the secret", cfg.mh)));
            n
        }
        Err(e) => {
            out.push(fail(
                "management host",
                format!("{}: {e}", cfg.mh),
                "start it (systemctl start rackwire-mh) or fix `mh` and the secret",
            ));
            return out;
        }
    };
    out.push(check_clock(offset, &nodes));
    let others: Vec<_> = nodes.iter().filter(|n| n.up && !n.info.links.is_empty()).take(PROBE_NODES_MAX).collect();
    if others.is_empty() || cfg.links.is_empty() {
        return out;
    }
    // A node of this run's own, on the links' addresses (ports the system picks), connects to
    // each: the edge transport's handshake over the rails proves them.
    let mut probe = cfg.clone();
    probe.name = "rackwire-doctor".into();
    probe.transient = true;
    probe.transport = rackwire::TransportChoice::Edge;
    probe.links = cfg
        .links
        .iter()
        .filter_map(|l| l.parse::<SocketAddr>().ok())
        .map(|a| SocketAddr::new(a.ip(), 0).to_string())
        .collect();
    probe.op_timeout = PROBE_TIMEOUT;
    let fabric = match rackwire::Fabric::join(probe) {
        Ok(f) => f,
        Err(e) => {
            out.push(fail("links reached", format!("cannot join to probe: {e}"), "see the findings above"));
            return out;
        }
    };
    for n in others {
        if n.info.id == fabric.id() {
            continue;
        }
        let name = &n.info.name;
        // Connecting waits for the handshake: a frame each way over the links.
        match fabric.connect(n.info.id) {
            Ok(conn) => {
                out.push(ok("links reached", format!("{name} over {}", n.info.links.join(", "))));
                out.push(check_path(name, &conn));
            }
            Err(e) => out.push(fail(
                "links reached",
                format!("{name} ({}): {e}", n.info.links.join(", ")),
                format!(
                    "check the rails' cabling and addresses; ping {}",
                    n.info.links[0].split(':').next().unwrap_or("")
                ),
            )),
        }
    }
    out
}

/// The longest frame the path to node `name` carries against the frame both ends' links
/// announced: the connection proves it with padded probes once connected (a round trip on a
/// sound path, a few milliseconds where a switch carries less).
fn check_path(name: &str, conn: &rackwire::Conn) -> Finding {
    let deadline = std::time::Instant::now() + PROBE_TIMEOUT;
    let mut s = conn.stats().edge_or_zero();
    while s.path_frame_max == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
        s = conn.stats().edge_or_zero();
    }
    match (s.path_frame_max, s.frame_max) {
        (0, _) => warn(
            "path mtu",
            format!("{name}: no padded probe answered in {PROBE_TIMEOUT:?}"),
            "check the rails' MTU end to end: ping -M do -s SIZE each link address",
        ),
        (path, agreed) if path < agreed => warn(
            "path mtu",
            format!(
                "{name}: a switch on the way carries frames of {path} bytes, not the {agreed} the hosts' links \
                 announce: frames are cut to {path}"
            ),
            format!(
                "raise every switch port's MTU on the rails to {} (or link_mtu = {path} on every host)",
                agreed as usize + IP_UDP_HEADER_BYTES
            ),
        ),
        (path, _) => ok("path mtu", format!("{name}: frames of {path} bytes cross every link both ways")),
    }
}

/// This machine's clock against the management host's: from the host's own time when it tells
/// it (`offset`: ours minus its, and the uncertainty, in milliseconds), else from when it last
/// heard from the nodes that are up (within a heartbeat by its clock).
fn check_clock(offset: Option<(i64, u64)>, nodes: &[rackwire_mh::NodeStatus]) -> Finding {
    let fix = "timedatectl set-ntp true (or chrony on every host)";
    let max = CLOCK_SKEW_MAX.as_millis() as i64;
    if let Some((off, within)) = offset {
        return if off.abs() - within as i64 > max {
            warn("clock", format!("{:+.3} s from the management host's (±{within} ms)", off as f64 / 1e3), fix)
        } else {
            ok("clock", format!("{off:+} ms from the management host's (±{within} ms)"))
        };
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
    let Some(seen) = nodes.iter().filter(|n| n.up).map(|n| n.last_seen_ms as i64).max() else {
        return warn("clock", "no node is up to compare the clock with", "start the agents, then run this again");
    };
    let skew = now - seen;
    let slack = rackwire_mh::HEARTBEAT_INTERVAL.as_millis() as i64;
    let off = if skew < 0 { -skew } else { (skew - slack).max(0) };
    if off > max {
        warn("clock", format!("about {:.1} s from the management host's", off as f64 / 1e3), fix)
    } else {
        ok("clock", "within a heartbeat of the management host's")
    }
}

/// Every check, in the order they are shown.
pub(crate) fn examine(host: &Host, file: Option<&Path>, reach_fabric: bool) -> Vec<Finding> {
    let (mut found, cfg) = check_config(file);
    found.extend(check_files(file, cfg.as_ref()));
    found.extend(check_kernel(host, cfg.as_ref()));
    if let Some(file) = file {
        found.extend(check_mh_listen(file));
    }
    if let Some(cfg) = &cfg {
        found.extend(check_links(host, cfg));
        if reach_fabric {
            found.extend(check_fabric(cfg));
        }
    }
    found
}

/// `rackwire doctor`: the findings as a table (or JSON); true when none failed.
pub(crate) fn run(config: Option<PathBuf>, json: bool, offline: bool) -> Result<bool> {
    let file = config.or_else(rackwire::config_path);
    if let Some(f) = &file {
        std::env::set_var(rackwire::vars::CONFIG, f);
    }
    let found = examine(&Host::real(), file.as_deref(), !offline);
    let passed = found.iter().all(|f| f.status != Status::Fail);
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "passed": passed, "findings": found }))?);
    } else {
        for f in &found {
            let mark = match f.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            println!("{mark} {:<17} {}", f.check, f.what);
            if let Some(fix) = &f.fix {
                println!("     {:<17} fix: {fix}", "");
            }
        }
        let failed = found.iter().filter(|f| f.status == Status::Fail).count();
        println!(
            "{}",
            if failed == 0 { "this host is ready".to_string() } else { format!("{failed} problem(s) to fix") }
        );
    }
    Ok(passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host laid out in `dir` with the given sysctls and a `tun` file (a plain file: no
    /// character device, so the TUN check warns).
    fn fake_host(dir: &Path, sysctls: &[(&str, &str)]) -> Host {
        for (k, v) in sysctls {
            let p = dir.join("sys").join(k.replace('.', "/"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
        Host { proc_sys: dir.join("sys"), class_net: dir.join("net"), tun: dir.join("tun") }
    }

    // Checks the kernel findings against a host laid out in a folder: strict reverse-path
    // filtering on `all` fails with the sysctl that fixes it; loose passes; socket buffer limits
    // below what the links ask for warn with both sysctls; no TUN device warns with modprobe.
    #[test]
    fn kernel_findings_name_the_fix() {
        let dir = std::env::temp_dir().join(format!("rw-doctor-{}", std::process::id()));
        let small = (rackwire_udp::SOCKET_BUFFER_BYTES / 4).to_string();
        let host = fake_host(
            &dir,
            &[("net.ipv4.conf.all.rp_filter", "1"), ("net.core.rmem_max", &small), ("net.core.wmem_max", &small)],
        );
        let found = check_kernel(&host, None);
        let get = |c: &str| found.iter().find(|f| f.check == c).unwrap_or_else(|| panic!("{c}: {found:?}"));
        assert_eq!(get("rp_filter").status, Status::Fail);
        assert_eq!(get("rp_filter").fix.as_deref(), Some("sysctl -w net.ipv4.conf.all.rp_filter=2"));
        assert_eq!(get("socket buffers").status, Status::Warn);
        assert!(get("socket buffers").fix.as_deref().unwrap().contains("net.core.wmem_max="));
        assert_eq!(get("tun").status, Status::Warn);
        assert_eq!(get("tun").fix.as_deref(), Some("modprobe tun"));
        let host = fake_host(
            &dir,
            &[
                ("net.ipv4.conf.all.rp_filter", "2"),
                ("net.core.rmem_max", "67108864"),
                ("net.core.wmem_max", "67108864"),
            ],
        );
        let found = check_kernel(&host, None);
        assert!(found.iter().filter(|f| f.check != "tun").all(|f| f.status == Status::Ok), "{found:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    // Checks the clock finding: an offset the host told within the limit passes and says it;
    // one past the limit (beyond its uncertainty) warns with the fix; with no time from the
    // host and no node up, it says there is nothing to compare with.
    #[test]
    fn the_clock_is_judged_by_the_hosts_time() {
        let f = check_clock(Some((120, 3)), &[]);
        assert_eq!(f.status, Status::Ok);
        assert!(f.what.contains("+120 ms"), "{}", f.what);
        let f = check_clock(Some((-5000, 2)), &[]);
        assert_eq!(f.status, Status::Warn);
        assert!(f.what.contains("-5.000 s") && f.fix.as_deref().unwrap().contains("set-ntp"), "{f:?}");
        assert_eq!(check_clock(None, &[]).status, Status::Warn);
    }

    // Checks the files: a secret file others may read fails with the chmod that fixes it; made
    // private, it passes.
    #[test]
    fn an_open_secret_file_fails_with_its_fix() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rw-doctor-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "doctor-secret-0123456789\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let file = dir.join("rackwire.toml");
        std::fs::write(&file, format!("mh = \"127.0.0.1:1\"\nsecret_file = {secret:?}\n")).unwrap();
        let found = check_files(Some(&file), None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].status, Status::Fail);
        assert!(found[0].fix.as_deref().unwrap().contains("chmod 600"), "{found:?}");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(check_files(Some(&file), None)[0].status, Status::Ok);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
