//! `rackwire bench vnic`: the virtual NIC against the Ethernet path between the same two hosts.
//!
//! Brings up a two-host rack with three rails: an unshaped veth rail (the path the virtual NIC
//! is compared with), one shaped to 1 Gbit/s and one to 10 Gbit/s (MTU 9000), the Ethernet the
//! papers compare with. Every host address is routed over rw0; each rail also gets a second
//! address per host that no agent publishes, so it stays on the Ethernet route. Then, in the
//! same run: iperf3 TCP (131072-byte writes) and UDP (large datagrams) and sockperf 64-byte
//! ping-pong over rw0 and over the unshaped veth, and iperf3 TCP over the shaped rails.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rackwire_bench::{iperf3_path, print_table, sockperf_path, NetPath, Report, Row};
use rackwire_rack::RackConfig;

/// iperf3's TCP write length in the rows.
const TCP_WRITE: u64 = 131_072;
/// UDP datagram size: large, under rw0's MTU (over a 1500-byte veth the kernel fragments it).
const UDP_DATAGRAM: u64 = 60_000;
/// sockperf message size.
const PING_SIZE: u64 = 64;
/// Rack name the benchmark uses.
const RACK: &str = "bvnic";

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
"#;

/// One measurement of the run.
type Measure<'a> = Box<dyn Fn() -> Result<Row, String> + 'a>;

/// An Ethernet-only address of host `i` on rail `k` (no agent publishes it).
fn plain_addr(i: usize, k: usize) -> String {
    format!("198.19.{k}.{}", i + 1)
}

fn route_dev(ns: &str, ip: &str) -> String {
    let out = std::process::Command::new("ip").args(["-n", ns, "route", "get", ip]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    text.split_whitespace().skip_while(|w| *w != "dev").nth(1).unwrap_or("").to_string()
}

pub(crate) fn run(json: bool, scale: f64) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("`rackwire bench vnic` builds a virtual rack: it needs root");
    }
    for tool in ["iperf3", "sockperf"] {
        if std::process::Command::new(tool).arg("--version").output().is_err() {
            bail!("{tool} is not installed (apt-get install {tool})");
        }
    }
    let secs = ((5.0 * scale).round() as u64).clamp(1, 30);
    let cfg = RackConfig::parse(CONFIG)?;
    let _ = rackwire_rack::down(Some(RACK));
    let exe = std::env::current_exe().context("own executable")?;
    let up = Instant::now();
    let state = rackwire_rack::up(&cfg, &exe)?;
    let up_ms = up.elapsed().as_millis();
    let _down = rackwire_rack::DownOnDrop(RACK.into());
    let (h1, h2) = (state.host("h1")?.ns.clone(), state.host("h2")?.ns.clone());
    for (i, ns) in [&h1, &h2].into_iter().enumerate() {
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
    // Both directions routed over rw0 before anything is measured.
    let deadline = Instant::now() + Duration::from_secs(10);
    while route_dev(&h1, "198.18.0.2") != "rw0" || route_dev(&h2, "198.18.0.1") != "rw0" {
        if Instant::now() > deadline {
            bail!("the agents did not route each other over rw0 within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let path = |addr: String| NetPath { server_ns: Some(h2.clone()), client_ns: Some(h1.clone()), addr };
    let vnic = path("198.18.0.2".into());
    let veth = path(plain_addr(1, 0));
    let mut report = Report::default();
    let runs: Vec<(&str, Measure<'_>)> = vec![
        ("vnic-tcp", Box::new(|| iperf3_path(&vnic, false, TCP_WRITE, secs, "vnic-tcp"))),
        ("veth-tcp", Box::new(|| iperf3_path(&veth, false, TCP_WRITE, secs, "veth-tcp"))),
        ("vnic-udp", Box::new(|| iperf3_path(&vnic, true, UDP_DATAGRAM, secs, "vnic-udp"))),
        ("veth-udp", Box::new(|| iperf3_path(&veth, true, UDP_DATAGRAM, secs, "veth-udp"))),
        ("vnic-sockperf", Box::new(|| sockperf_path(&vnic, PING_SIZE, secs, false, "vnic-sockperf"))),
        ("veth-sockperf", Box::new(|| sockperf_path(&veth, PING_SIZE, secs, false, "veth-sockperf"))),
        ("veth-1g-tcp", Box::new(|| iperf3_path(&path(plain_addr(1, 1)), false, TCP_WRITE, secs, "veth-1g-tcp"))),
        ("veth-10g-tcp", Box::new(|| iperf3_path(&path(plain_addr(1, 2)), false, TCP_WRITE, secs, "veth-10g-tcp"))),
    ];
    for (name, f) in &runs {
        if !json {
            eprintln!("measuring {name} ...");
        }
        match f() {
            Ok(r) => report.rows.push(r),
            Err(e) => report.notes.push(format!("{name}: {e}")),
        }
    }
    let get = |t: &str| report.rows.iter().find(|r| r.transport == t).cloned();
    let mb = |t: &str| get(t).and_then(|r| r.mb_per_s);
    let lat = |t: &str| get(t).and_then(|r| r.lat_us_p50.or(r.lat_us_avg));
    let mut notes = Vec::new();
    if let (Some(a), Some(b)) = (mb("vnic-tcp"), mb("veth-tcp")) {
        notes.push(format!("TCP over rw0 / over the unshaped veth: {:.2}", a / b));
    }
    if let (Some(a), Some(b)) = (mb("vnic-udp"), mb("veth-udp")) {
        notes.push(format!("UDP ({UDP_DATAGRAM}-byte datagrams) over rw0 / over the veth: {:.2}", a / b));
    }
    if let (Some(a), Some(b)) = (lat("vnic-sockperf"), lat("veth-sockperf")) {
        notes.push(format!("64 B latency over rw0 / over the veth: {:.2}", a / b));
    }
    for shaped in ["veth-1g-tcp", "veth-10g-tcp"] {
        if let (Some(a), Some(b)) = (mb("vnic-tcp"), mb(shaped)) {
            notes.push(format!("TCP over rw0 / {shaped}: {:.1}x", a / b));
        }
    }
    notes.push(format!("rack of 2 hosts and 3 rails up in {up_ms} ms"));
    report.notes.extend(notes);
    report.meta.insert("command".into(), std::env::args().collect::<Vec<_>>().join(" ").into());
    report.meta.insert("seconds_per_run".into(), secs.into());
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", print_table(&report));
    }
    Ok(())
}
