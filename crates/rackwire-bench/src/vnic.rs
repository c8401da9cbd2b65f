//! `rackwire bench vnic`: the virtual NIC against the Ethernet path between the same hosts.
//!
//! Brings up a rack of three hosts with three rails: an unshaped veth rail (the path the
//! virtual NIC is compared with), one shaped to 1 Gbit/s and one to 10 Gbit/s (MTU 9000), the
//! Ethernet the papers compare with. `h1` and `h2` share memory (one rack: rw0 rides shared
//! memory between them); `h3` is in another memory domain (another rack: rw0 rides the edge
//! transport over the rails). Every host address is routed over rw0; each rail also gets a
//! second address per host that no agent publishes, so it stays on the Ethernet route. Then,
//! in the same run: iperf3 TCP (131072-byte writes) and UDP (large datagrams, at the highest
//! rate each path carries with at most 1% lost) and sockperf
//! 64-byte ping-pong between `h1` and `h2` over rw0 and over the unshaped veth, iperf3 TCP over
//! the shaped rails, and sockperf 64-byte UDP and TCP ping-pong between `h1` and `h3` (across
//! racks) over rw0 and over the veth. Beside them, the same TCP stream and ping-pong between
//! `h1` and `h2` through a bare TUN-to-TUN relay (`rackwire_vnic::TunRelay`: a device in each
//! host set up as rw0 is, one thread per direction copying packets across, nothing else): the
//! limit of any virtual NIC built on a TUN device; and the same cross-rack ping-pong between
//! `h1` and `h3` through a bare TUN-over-UDP tunnel (`rackwire_vnic::UdpTunnel`: a device in
//! each host, its packets carried whole as UDP datagrams over the veth, waiting as the edge
//! transport's network thread does, nothing else): the limit of any virtual NIC that carries
//! a TUN device's packets between hosts over UDP, as rw0 does across racks. Across racks also
//! the highest rate of 64-byte UDP datagrams each of the three paths carries from `h1` to `h3`
//! with at most 1% lost (iperf3, paced). `--repeat N` runs
//! the whole comparison N times and gives each ratio's median and spread.
//!
//! The three hosts share this machine's cores. `--host-cores` gives each a core of its own, as
//! real hosts have (`h1` the first this process may use, `h2` the second, `h3` the third or,
//! on a machine of two, the second again: `h2` idles while `h3` is measured, and the other
//! way round): its agent, the peer tools' ends in it, and the relay's and the tunnel's threads
//! that read its devices run there, for the veth rows and the rw0 rows alike.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crate::{
    iperf3_path, iperf3_udp_capacity, print_table, sockperf_path, NetPath, Report, Row, UDP_SEARCH_LARGE,
    UDP_SEARCH_SMALL,
};
use anyhow::{bail, Context, Result};
use rackwire_rack::{cores, RackConfig};
use rackwire_vnic::{RelayEnd, TunRelay, TunnelEnd, UdpTunnel};

use crate::repeat::median_spread;

/// iperf3's TCP write length in the rows.
const TCP_WRITE: u64 = 131_072;
/// UDP datagram size: large, under rw0's MTU (over a 1500-byte veth the kernel fragments it).
const UDP_DATAGRAM: u64 = 60_000;
/// sockperf message size, and the size of the small datagrams sent across racks at the
/// highest rate they are carried.
const PING_SIZE: u64 = 64;
/// Rack name the benchmark uses.
const RACK: &str = "bvnic";
/// The bare TUN relay's subnet (a /24): h1's end is .1, h2's .2.
const RELAY_SUBNET: [u8; 3] = [198, 19, 100];
/// The bare UDP tunnel's subnet (a /24): h1's end is .1, h3's .3.
const TUNNEL_SUBNET: [u8; 3] = [198, 19, 101];
/// Most repeats of the whole comparison.
const REPEAT_MAX: usize = 20;

const CONFIG: &str = r#"
name = "bvnic"
[[rail]]
mtu = 1500
[[rail]]
rate = "1gbit"
mtu = 1500
[[rail]]
rate = "10gbit"
mtu = 9000
[[host]]
name = "h1"
[[host]]
name = "h2"
[[host]]
name = "h3"
domain = "far"
"#;

/// One measurement of the run.
type Measure<'a> = Box<dyn Fn() -> Result<Row, String> + 'a>;

/// An Ethernet-only address of host `i` on rail `k` (no agent publishes it).
pub(crate) fn plain_addr(i: usize, k: usize) -> String {
    format!("198.19.{k}.{}", i + 1)
}

/// The device `ns` routes `ip` over.
pub(crate) fn route_dev(ns: &str, ip: &str) -> String {
    let out = std::process::Command::new("ip").args(["-n", ns, "route", "get", ip]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    text.split_whitespace().skip_while(|w| *w != "dev").nth(1).unwrap_or("").to_string()
}

/// 64 B UDP datagrams from `h1` over `path` at the highest rate it carries with at most 1%
/// lost: what a flood of small packets (a game's or a telemetry feed's) gets across racks,
/// where every datagram over rw0 is a frame of the edge transport.
fn small_udp(path: &NetPath, secs: u64, transport: &str) -> Result<Row, String> {
    iperf3_udp_capacity(path, PING_SIZE, secs, UDP_SEARCH_SMALL, transport)
}

/// `--host-cores`: each host of `cfg` a core of its own among those this process may use (the
/// hosts past the last core share it).
pub(crate) fn give_hosts_cores(cfg: &mut RackConfig) -> Result<()> {
    let usable = cores::usable().context("this process's cores")?;
    if usable.len() < 2 {
        bail!("--host-cores needs two cores at least (this process may use {})", cores::cores_text(&usable));
    }
    for (i, h) in cfg.hosts.iter_mut().enumerate() {
        h.cores = vec![usable[i.min(usable.len() - 1)]];
    }
    Ok(())
}

/// A ratio of two rows of one repeat: `(name, what it compares, the figure of a row)`.
struct Ratio {
    name: &'static str,
    ours: &'static str,
    theirs: &'static str,
    figure: fn(&Row) -> Option<f64>,
}

fn mb(r: &Row) -> Option<f64> {
    r.mb_per_s
}
fn p50(r: &Row) -> Option<f64> {
    r.lat_us_p50
}
fn mean(r: &Row) -> Option<f64> {
    r.lat_us_avg
}
fn cost(r: &Row) -> Option<f64> {
    r.core_s_per_gb
}
fn cost_op(r: &Row) -> Option<f64> {
    r.core_us_per_op
}

/// The comparisons the run reports, each as ours / the Ethernet's (throughput: higher is
/// better; latency and cost: lower is better). The cost of a TCP stream is the machine's busy
/// core-seconds per byte (both hosts share it): where both paths are bound by its cores, as
/// here, their rates stand in about the inverse proportion of their costs, so the cost ratio
/// says how near the veth's rate rw0 can come. A ping-pong's cost is its busy time per round
/// trip: what the threads that look for the answer rather than sleep cost.
const RATIOS: &[Ratio] = &[
    Ratio { name: "TCP over rw0 / over the unshaped veth", ours: "vnic-tcp", theirs: "veth-tcp", figure: mb },
    Ratio {
        name: "UDP (60000-byte datagrams) at the highest rate with at most 1% lost, over rw0 / over the veth",
        ours: "vnic-udp",
        theirs: "veth-udp",
        figure: mb,
    },
    Ratio {
        name: "64 B latency p50 over rw0 / over the veth",
        ours: "vnic-sockperf",
        theirs: "veth-sockperf",
        figure: p50,
    },
    Ratio {
        name: "64 B latency mean over rw0 / over the veth",
        ours: "vnic-sockperf",
        theirs: "veth-sockperf",
        figure: mean,
    },
    Ratio {
        name: "across racks, 64 B UDP latency p50 over rw0 / over the veth",
        ours: "xrack-vnic-udp",
        theirs: "xrack-veth-udp",
        figure: p50,
    },
    Ratio {
        name: "across racks, 64 B TCP latency p50 over rw0 / over the veth",
        ours: "xrack-vnic-tcp",
        theirs: "xrack-veth-tcp",
        figure: p50,
    },
    Ratio {
        name: "across racks, 64 B UDP latency p50 over rw0 / over a bare UDP tunnel",
        ours: "xrack-vnic-udp",
        theirs: "xrack-tunnel-udp",
        figure: p50,
    },
    Ratio {
        name: "across racks, 64 B UDP latency p50 over a bare UDP tunnel / over the veth",
        ours: "xrack-tunnel-udp",
        theirs: "xrack-veth-udp",
        figure: p50,
    },
    Ratio {
        name: "across racks, 64 B TCP latency p50 over rw0 / over a bare UDP tunnel",
        ours: "xrack-vnic-tcp",
        theirs: "xrack-tunnel-tcp",
        figure: p50,
    },
    Ratio {
        name: "across racks, 64 B UDP datagrams at the highest rate with at most 1% lost, over rw0 / over the veth",
        ours: "xrack-vnic-rate",
        theirs: "xrack-veth-rate",
        figure: mb,
    },
    Ratio {
        name: "across racks, 64 B UDP datagrams at the highest rate with at most 1% lost, over rw0 / over a bare UDP tunnel",
        ours: "xrack-vnic-rate",
        theirs: "xrack-tunnel-rate",
        figure: mb,
    },
    Ratio {
        name: "TCP, the machine's core-seconds per byte, over rw0 / over the veth",
        ours: "vnic-tcp",
        theirs: "veth-tcp",
        figure: cost,
    },
    Ratio {
        name: "TCP, the machine's core-seconds per byte, over a bare TUN relay / over the veth",
        ours: "tun-relay-tcp",
        theirs: "veth-tcp",
        figure: cost,
    },
    Ratio {
        name: "64 B ping-pong, the machine's core time per round trip, over rw0 / over the veth",
        ours: "vnic-sockperf",
        theirs: "veth-sockperf",
        figure: cost_op,
    },
    Ratio {
        name: "across racks, 64 B UDP ping-pong, the machine's core time per round trip, over rw0 / over the veth",
        ours: "xrack-vnic-udp",
        theirs: "xrack-veth-udp",
        figure: cost_op,
    },
    Ratio { name: "TCP over rw0 / over a bare TUN relay", ours: "vnic-tcp", theirs: "tun-relay-tcp", figure: mb },
    Ratio { name: "TCP over a bare TUN relay / over the veth", ours: "tun-relay-tcp", theirs: "veth-tcp", figure: mb },
    Ratio {
        name: "64 B latency p50 over rw0 / over a bare TUN relay",
        ours: "vnic-sockperf",
        theirs: "tun-relay-sockperf",
        figure: p50,
    },
    Ratio {
        name: "64 B latency p50 over a bare TUN relay / over the veth",
        ours: "tun-relay-sockperf",
        theirs: "veth-sockperf",
        figure: p50,
    },
    Ratio { name: "TCP over rw0 / veth-1g-tcp", ours: "vnic-tcp", theirs: "veth-1g-tcp", figure: mb },
    Ratio { name: "TCP over rw0 / veth-10g-tcp", ours: "vnic-tcp", theirs: "veth-10g-tcp", figure: mb },
];

/// How `rackwire bench vnic` runs.
pub struct VnicBench {
    /// One JSON document instead of a table.
    pub json: bool,
    /// Time scale of each row.
    pub scale: f64,
    /// Runs of the whole comparison.
    pub repeat: usize,
    /// Each host on a core of its own.
    pub host_cores: bool,
    /// Only the rows whose names start with one of these (none: every row).
    pub rows: Vec<String>,
}

/// The rows, in the order they are measured.
const ROWS: &[&str] = &[
    "vnic-tcp",
    "veth-tcp",
    "tun-relay-tcp",
    "vnic-udp",
    "veth-udp",
    "vnic-sockperf",
    "veth-sockperf",
    "tun-relay-sockperf",
    "xrack-vnic-udp",
    "xrack-veth-udp",
    "xrack-tunnel-udp",
    "xrack-vnic-tcp",
    "xrack-veth-tcp",
    "xrack-tunnel-tcp",
    "xrack-vnic-rate",
    "xrack-veth-rate",
    "xrack-tunnel-rate",
    "veth-1g-tcp",
    "veth-10g-tcp",
];

/// Whether `--rows` (prefixes; none: all) asks for row `name`.
fn wanted(rows: &[String], name: &str) -> bool {
    rows.is_empty() || rows.iter().any(|p| name.starts_with(p.as_str()))
}

/// Run `rackwire bench vnic` and print its rows.
pub fn run(opts: &VnicBench) -> Result<()> {
    let VnicBench { json, scale, repeat, host_cores, .. } = *opts;
    if let Some(p) = opts.rows.iter().find(|p| p.is_empty() || !ROWS.iter().any(|n| n.starts_with(p.as_str()))) {
        bail!("--rows: no row starts with {p:?} (rows: {})", ROWS.join(", "));
    }
    if !rustix::process::geteuid().is_root() {
        bail!("`rackwire bench vnic` builds a virtual rack: it needs root");
    }
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    for tool in ["iperf3", "sockperf"] {
        if std::process::Command::new(tool).arg("--version").output().is_err() {
            bail!("{tool} is not installed (apt-get install {tool})");
        }
    }
    let secs = ((5.0 * scale).round() as u64).clamp(1, 30);
    // A UDP row is several paced runs (see `iperf3_udp_capacity`), each shorter.
    let udp_secs = (secs / 2).max(1);
    let mut cfg = RackConfig::parse(CONFIG)?;
    if host_cores {
        give_hosts_cores(&mut cfg)?;
    }
    let _ = rackwire_rack::down(Some(RACK));
    let exe = crate::spawn::own_exe()?;
    let up = Instant::now();
    let state = rackwire_rack::up(&cfg, &exe)?;
    let up_ms = up.elapsed().as_millis();
    let _down = rackwire_rack::DownOnDrop(RACK.into());
    let hosts: Vec<String> =
        ["h1", "h2", "h3"].iter().map(|h| state.host(h).map(|s| s.ns.clone())).collect::<Result<_, _>>()?;
    let (h1, h2, h3) = (hosts[0].clone(), hosts[1].clone(), hosts[2].clone());
    let on = |ns: &str| state.hosts.iter().find(|h| h.ns == ns).map(|h| h.cores.clone()).unwrap_or_default();
    for (i, ns) in hosts.iter().enumerate() {
        for k in 0..cfg.rails.len() {
            rackwire_vnic::ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{}/24", plain_addr(i, k)),
                "dev",
                &format!("eth{k}"),
            ])?;
        }
    }
    // Every pair measured routed over rw0, both ways, before anything is measured.
    let deadline = Instant::now() + Duration::from_secs(10);
    let pairs = [(&h1, "198.18.0.2"), (&h2, "198.18.0.1"), (&h1, "198.18.0.3"), (&h3, "198.18.0.1")];
    while pairs.iter().any(|(ns, ip)| route_dev(ns, ip) != "rw0") {
        if Instant::now() > deadline {
            bail!("the agents did not route each other over rw0 within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let relay_addr = |i: u8| Ipv4Addr::new(RELAY_SUBNET[0], RELAY_SUBNET[1], RELAY_SUBNET[2], i);
    let _relay = TunRelay::start(
        &RelayEnd { netns: h1.clone(), addr: relay_addr(1), cores: on(&h1) },
        &RelayEnd { netns: h2.clone(), addr: relay_addr(2), cores: on(&h2) },
    )
    .context("the bare TUN relay between h1 and h2")?;
    // Its datagrams go over the unshaped rail, between the hosts' Ethernet-only addresses.
    let tunnel_addr = |i: u8| Ipv4Addr::new(TUNNEL_SUBNET[0], TUNNEL_SUBNET[1], TUNNEL_SUBNET[2], i);
    let carrier = |i: usize| plain_addr(i, 0).parse::<Ipv4Addr>().expect("an IPv4 address");
    let _tunnel = UdpTunnel::start(
        &TunnelEnd { netns: h1.clone(), addr: tunnel_addr(1), carrier: carrier(0), cores: on(&h1) },
        &TunnelEnd { netns: h3.clone(), addr: tunnel_addr(3), carrier: carrier(2), cores: on(&h3) },
    )
    .context("the bare UDP tunnel between h1 and h3")?;
    let path = |server: &str, addr: String| NetPath {
        server_ns: Some(server.into()),
        client_ns: Some(h1.clone()),
        addr,
        server_cores: on(server),
        client_cores: on(&h1),
    };
    let vnic = path(&h2, "198.18.0.2".into());
    let veth = path(&h2, plain_addr(1, 0));
    let relay = path(&h2, relay_addr(2).to_string());
    let far_vnic = path(&h3, "198.18.0.3".into());
    let far_veth = path(&h3, plain_addr(2, 0));
    let far_tunnel = path(&h3, tunnel_addr(3).to_string());
    let (one_g, ten_g) = (path(&h2, plain_addr(1, 1)), path(&h2, plain_addr(1, 2)));
    let runs: Vec<(&str, Measure<'_>)> = vec![
        ("vnic-tcp", Box::new(|| iperf3_path(&vnic, TCP_WRITE, secs, "vnic-tcp"))),
        ("veth-tcp", Box::new(|| iperf3_path(&veth, TCP_WRITE, secs, "veth-tcp"))),
        ("tun-relay-tcp", Box::new(|| iperf3_path(&relay, TCP_WRITE, secs, "tun-relay-tcp"))),
        ("vnic-udp", Box::new(|| iperf3_udp_capacity(&vnic, UDP_DATAGRAM, udp_secs, UDP_SEARCH_LARGE, "vnic-udp"))),
        ("veth-udp", Box::new(|| iperf3_udp_capacity(&veth, UDP_DATAGRAM, udp_secs, UDP_SEARCH_LARGE, "veth-udp"))),
        ("vnic-sockperf", Box::new(|| sockperf_path(&vnic, PING_SIZE, secs, false, false, "vnic-sockperf"))),
        ("veth-sockperf", Box::new(|| sockperf_path(&veth, PING_SIZE, secs, false, false, "veth-sockperf"))),
        ("tun-relay-sockperf", Box::new(|| sockperf_path(&relay, PING_SIZE, secs, false, false, "tun-relay-sockperf"))),
        ("xrack-vnic-udp", Box::new(|| sockperf_path(&far_vnic, PING_SIZE, secs, false, false, "xrack-vnic-udp"))),
        ("xrack-veth-udp", Box::new(|| sockperf_path(&far_veth, PING_SIZE, secs, false, false, "xrack-veth-udp"))),
        (
            "xrack-tunnel-udp",
            Box::new(|| sockperf_path(&far_tunnel, PING_SIZE, secs, false, false, "xrack-tunnel-udp")),
        ),
        ("xrack-vnic-tcp", Box::new(|| sockperf_path(&far_vnic, PING_SIZE, secs, false, true, "xrack-vnic-tcp"))),
        ("xrack-veth-tcp", Box::new(|| sockperf_path(&far_veth, PING_SIZE, secs, false, true, "xrack-veth-tcp"))),
        ("xrack-tunnel-tcp", Box::new(|| sockperf_path(&far_tunnel, PING_SIZE, secs, false, true, "xrack-tunnel-tcp"))),
        ("xrack-vnic-rate", Box::new(|| small_udp(&far_vnic, udp_secs, "xrack-vnic-rate"))),
        ("xrack-veth-rate", Box::new(|| small_udp(&far_veth, udp_secs, "xrack-veth-rate"))),
        ("xrack-tunnel-rate", Box::new(|| small_udp(&far_tunnel, udp_secs, "xrack-tunnel-rate"))),
        ("veth-1g-tcp", Box::new(|| iperf3_path(&one_g, TCP_WRITE, secs, "veth-1g-tcp"))),
        ("veth-10g-tcp", Box::new(|| iperf3_path(&ten_g, TCP_WRITE, secs, "veth-10g-tcp"))),
    ];
    assert!(runs.iter().map(|(n, _)| *n).eq(ROWS.iter().copied()), "ROWS names the rows in order");
    let mut runs = runs;
    runs.retain(|(name, _)| wanted(&opts.rows, name));
    let mut report = Report::default();
    // Per ratio, its value in each repeat that measured both rows.
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); RATIOS.len()];
    for rep in 0..repeat {
        let mut rows = Vec::new();
        for (name, f) in &runs {
            if !json {
                eprintln!("measuring {name} ({} of {repeat}) ...", rep + 1);
            }
            match f() {
                Ok(mut r) => {
                    if repeat > 1 {
                        r.variant = Some(format!("run {}", rep + 1));
                    }
                    rows.push(r);
                }
                Err(e) => report.notes.push(format!("{name} (run {}): {e}", rep + 1)),
            }
        }
        let get = |t: &str| rows.iter().find(|r| r.transport == t);
        for (k, r) in RATIOS.iter().enumerate() {
            let ours = get(r.ours).and_then(r.figure);
            let theirs = get(r.theirs).and_then(r.figure);
            if let (Some(a), Some(b)) = (ours, theirs) {
                if b > 0.0 {
                    ratios[k].push(a / b);
                }
            }
        }
        report.rows.extend(rows);
    }
    let mut summary = serde_json::Map::new();
    for (r, mut v) in RATIOS.iter().zip(ratios) {
        if v.is_empty() {
            continue;
        }
        let runs = v.clone();
        let (m, lo, hi) = median_spread(&mut v);
        report.notes.push(if v.len() > 1 {
            format!("{}: {m:.2} (median of {}; {lo:.2}-{hi:.2})", r.name, v.len())
        } else {
            format!("{}: {m:.2}", r.name)
        });
        summary.insert(
            r.name.into(),
            serde_json::json!({ "ours": r.ours, "theirs": r.theirs, "median": m, "min": lo, "max": hi, "runs": runs }),
        );
    }
    report.notes.push(format!("rack of 3 hosts (h3 in another memory domain) and 3 rails up in {up_ms} ms"));
    if host_cores {
        let each: Vec<String> =
            state.hosts.iter().map(|h| format!("{} on core {}", h.name, cores::cores_text(&h.cores))).collect();
        report.notes.push(format!("each host on a core of its own (--host-cores): {}", each.join(", ")));
    }
    report.meta.insert("command".into(), std::env::args().collect::<Vec<_>>().join(" ").into());
    report.meta.insert("seconds_per_run".into(), secs.into());
    report.meta.insert("repeats".into(), repeat.into());
    report.meta.insert("host_cores".into(), host_cores.into());
    report.meta.insert("ratios".into(), summary.into());
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", print_table(&report));
    }
    Ok(())
}
