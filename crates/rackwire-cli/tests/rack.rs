//! The virtual rack and the virtual NIC as a user runs them: `rackwire rack up/status/exec/
//! down`, unmodified TCP and UDP programs (iperf3) between hosts over rw0, the Ethernet route
//! to a remote host, and an agent killed in the middle of a stream. Root only (namespaces,
//! TUN): elsewhere each test says it is skipped and passes.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rackwire_tests::{succeeded as ok, TempDir};
use serde_json::Value;

/// How long a test waits for routes to appear or disappear (generous: tests run side by side
/// on a small, loaded host).
const ROUTE_WAIT: Duration = Duration::from_secs(20);

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0").unwrap_or(false)
}

fn have(prog: &str) -> bool {
    Command::new(prog).arg("--version").output().is_ok()
}

/// True (and says why) when this test cannot run here.
fn skip(what: &str) -> bool {
    if !is_root() {
        eprintln!("SKIPPED {what}: needs root (network namespaces, TUN)");
        return true;
    }
    if !have("iperf3") {
        eprintln!("SKIPPED {what}: iperf3 is not installed");
        return true;
    }
    false
}

fn rackwire(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rackwire")).args(args).output().expect("run rackwire")
}

/// A rack that is taken down when the test ends, also when it fails.
struct Rack {
    name: String,
    _dir: TempDir,
    state: Value,
}

impl Rack {
    fn up(name: &str, toml: &str) -> Rack {
        let dir = TempDir::new("rack");
        let path = dir.0.join("rack.toml");
        std::fs::write(&path, toml.replace("NAME", name)).unwrap();
        // Leftovers of an earlier, killed run of this test go first.
        let _ = rackwire(&["rack", "down", "--name", name]);
        let out = ok(&rackwire(&["rack", "up", "--config", path.to_str().unwrap(), "--json"]));
        Rack { name: name.into(), _dir: dir, state: serde_json::from_str(&out).expect("rack up --json") }
    }

    fn exec(&self, host: &str, cmd: &[&str]) -> Output {
        let mut args = vec!["rack", "exec", host, "--name", &self.name, "--"];
        args.extend_from_slice(cmd);
        rackwire(&args)
    }

    fn status(&self) -> Value {
        serde_json::from_str(&ok(&rackwire(&["rack", "status", "--name", &self.name, "--json"]))).unwrap()
    }

    /// Host `from`'s counters for its peer `to` on rw0.
    fn peer_counters(&self, from: &str, to: &str) -> Option<Value> {
        let s = self.status();
        let h = s["hosts"].as_array()?.iter().find(|h| h["name"] == from)?.clone();
        h.pointer("/agent/vnic/peers")?.as_array()?.iter().find(|p| p["name"] == to).cloned()
    }

    /// The device `from` routes `ip` through.
    fn route_dev(&self, from: &str, ip: &str) -> String {
        let out = String::from_utf8_lossy(&self.exec(from, &["ip", "route", "get", ip]).stdout).into_owned();
        out.split_whitespace().skip_while(|w| *w != "dev").nth(1).unwrap_or("").to_string()
    }

    /// The counters, once the agent has written them (it does every quarter second).
    fn wait_counters(&self, from: &str, to: &str, until: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + ROUTE_WAIT;
        loop {
            if let Some(c) = self.peer_counters(from, to).filter(|c| until(c)) {
                return c;
            }
            assert!(Instant::now() < deadline, "{from}: counters for {to} never showed what was expected");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn wait_route(&self, from: &str, ip: &str, dev: &str) {
        let deadline = Instant::now() + ROUTE_WAIT;
        while self.route_dev(from, ip) != dev {
            assert!(Instant::now() < deadline, "{from}: route to {ip} never went through {dev}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// An iperf3 server in `host` (one client, then it exits).
    fn iperf_server(&self, host: &str, port: &str) {
        ok(&self.exec(host, &["iperf3", "-s", "-1", "-D", "-p", port]));
        std::thread::sleep(Duration::from_millis(300));
    }

    fn iperf(&self, host: &str, args: &[&str]) -> Value {
        let mut cmd = vec!["iperf3", "-J"];
        cmd.extend_from_slice(args);
        let o = self.exec(host, &cmd);
        serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|_| panic!("iperf3 {args:?}: {}", String::from_utf8_lossy(&o.stderr)))
    }
}

impl Drop for Rack {
    fn drop(&mut self) {
        let _ = rackwire(&["rack", "down", "--name", &self.name]);
    }
}

/// Figure `field` of the first row of the benchmark report `v` whose transport is `t`.
fn row_figure(v: &Value, t: &str, field: &str) -> Option<f64> {
    v["rows"].as_array()?.iter().find(|r| r["transport"] == t)?[field].as_f64()
}

fn namespaces(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(String::from)
        .collect()
}

fn root_links() -> usize {
    let out = Command::new("ip").args(["-o", "link"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().count()
}

const FOUR_HOSTS: &str = r#"
name = "NAME"
[[rail]]
rate = "10gbit"
mtu = 9000
[[rail]]
rate = "1gbit"
mtu = 1500
[[host]]
name = "h1"
[[host]]
name = "h2"
[[host]]
name = "h3"
[[host]]
name = "h4"
[[host]]
name = "far"
remote = true
"#;

// Checks that `rack up` makes a namespace per host and the switch namespace, starts an agent
// per local host (rw0 up, peers routed), and that `rack down` leaves no namespace, process,
// link in this namespace or state folder behind: the namespace list, the agents' process ids
// and the root namespace's link count are compared before and after.
#[test]
fn rack_up_then_down_leaves_nothing() {
    if skip("rack_up_then_down_leaves_nothing") {
        return;
    }
    let links_before = root_links();
    let rack = Rack::up("tupdown", FOUR_HOSTS);
    let nss = namespaces("rwr-tupdown-");
    assert_eq!(nss.len(), 6, "five hosts and the switch: {nss:?}");
    let pids: Vec<u64> = rack.state["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["pids"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()))
        .collect();
    assert_eq!(pids.len(), 5, "four agents and a management host");
    rack.wait_route("h1", "198.18.1.4", "rw0");
    let dir = rack.state["dir"].as_str().unwrap().to_string();
    let out = ok(&rackwire(&["rack", "down", "--name", "tupdown"]));
    assert!(out.contains("removed 6 namespaces"), "{out}");
    assert!(namespaces("rwr-tupdown-").is_empty());
    for p in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{p}")).exists() || {
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                stat.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            },
            "process {p} still runs"
        );
    }
    assert!(!std::path::Path::new(&dir).exists(), "state folder {dir} left behind");
    assert_eq!(root_links(), links_before, "links left in the root namespace");
    // Down again: nothing left to remove is a clear error, not a crash.
    let again = rackwire(&["rack", "down", "--name", "tupdown"]);
    assert!(again.status.success() || !String::from_utf8_lossy(&again.stderr).contains("panicked"));
}

/// The `Cpus_allowed_list` line's value in a `/proc/.../status` text.
fn allowed(status: &str) -> String {
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap_or_default().trim().to_string()
}

// Checks a host's cores: with `cores = [c]` on h1 (c: the last core this process may use),
// every thread of h1's agent (and the management host, which runs in h1) and a program started
// with `rack exec h1` are allowed core c alone (read from /proc), while h2's agent keeps every
// core this process has, and `rack status` shows both; a rack naming a core this machine does not let it use is refused by
// `rack up` with a message that says so, and leaves no namespace behind.
#[test]
fn a_hosts_programs_run_on_its_cores() {
    if skip("a_hosts_programs_run_on_its_cores") {
        return;
    }
    let mine = allowed(&std::fs::read_to_string("/proc/self/status").unwrap());
    let last: usize = mine.rsplit([',', '-']).next().unwrap().parse().unwrap();
    let toml =
        format!("name = \"NAME\"\n[[rail]]\n[[host]]\nname = \"h1\"\ncores = [{last}]\n[[host]]\nname = \"h2\"\n");
    let rack = Rack::up("tcores", &toml);
    let pids = |h: usize| -> Vec<u64> {
        rack.state["hosts"][h]["pids"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect()
    };
    let (h1, h2) = (pids(0), pids(1));
    assert_eq!(h1.len(), 2, "h1 runs the management host and its agent");
    for pid in h1 {
        let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten().collect();
        assert!(tasks.len() > 1, "process {pid} has its threads");
        for t in tasks {
            let st = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            assert_eq!(allowed(&st), last.to_string(), "thread {:?} of {pid}", t.file_name());
        }
    }
    let st = std::fs::read_to_string(format!("/proc/{}/status", h2[0])).unwrap();
    assert_eq!(allowed(&st), mine, "h2 has no cores of its own: it keeps ours");
    let out = ok(&rack.exec("h1", &["grep", "Cpus_allowed_list", "/proc/self/status"]));
    assert_eq!(allowed(&out), last.to_string(), "a program run in h1");
    // `rack status` says so: h1's row names its core, h2's says any.
    let table = ok(&rackwire(&["rack", "status", "--name", "tcores"]));
    let cells = |h: &str| -> Vec<String> {
        let split = |l: &str| l.split(['│', '┆', '|']).map(|c| c.trim().to_string()).collect::<Vec<_>>();
        table.lines().map(split).find(|c| c.get(1).is_some_and(|c| c == h)).unwrap_or_default()
    };
    assert!(cells("h1").contains(&last.to_string()), "{table}");
    assert!(cells("h2").contains(&"any".to_string()), "{table}");
    drop(rack);

    let dir = TempDir::new("cores");
    let path = dir.0.join("rack.toml");
    std::fs::write(&path, toml.replace("NAME", "tcoresx").replace(&format!("[{last}]"), "[1000]")).unwrap();
    let refused = rackwire(&["rack", "up", "--config", path.to_str().unwrap()]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("core 1000 is not one this machine lets rackwire run on"), "{err}");
    assert!(namespaces("rwr-tcoresx-").is_empty(), "nothing made");
}

const THREE_AND_REMOTE: &str = r#"
name = "NAME"
[[rail]]
mtu = 1500
[[host]]
name = "h1"
[[host]]
name = "h2"
[[host]]
name = "h3"
[[host]]
name = "far"
remote = true
"#;

// Checks unmodified programs over rw0: an iperf3 TCP stream and a UDP exchange from h2 to h3
// take the route through rw0 (`ip route get`), arrive (iperf3's own byte counts), and show up
// in h2's per-peer counters; traffic to the remote host takes the Ethernet route and works
// too, without touching rw0's counters for it (rw0 has no such peer).
#[test]
fn tcp_and_udp_run_unmodified_over_rw0_and_remote_traffic_uses_ethernet() {
    if skip("tcp_and_udp_run_unmodified_over_rw0") {
        return;
    }
    let rack = Rack::up("tvnic", THREE_AND_REMOTE);
    rack.wait_route("h2", "198.18.0.3", "rw0");
    // h3 must route h2 too, or replies would come back over Ethernet.
    rack.wait_route("h3", "198.18.0.2", "rw0");
    assert_eq!(rack.route_dev("h2", "198.18.0.4"), "eth0", "the remote host is reached over Ethernet");

    let before = rack.wait_counters("h2", "h3", |_| true);
    rack.iperf_server("h3", "5411");
    let tcp = rack.iperf("h2", &["-c", "198.18.0.3", "-p", "5411", "-t", "1"]);
    let tcp_bytes = tcp.pointer("/end/sum_received/bytes").and_then(Value::as_u64).unwrap_or(0);
    assert!(tcp_bytes > 1_000_000, "TCP over rw0 carried {tcp_bytes} bytes");

    rack.iperf_server("h3", "5412");
    let udp = rack.iperf("h2", &["-c", "198.18.0.3", "-p", "5412", "-u", "-b", "20M", "-l", "8000", "-t", "1"]);
    let udp_packets = udp.pointer("/end/sum/packets").and_then(Value::as_u64).unwrap_or(0);
    let udp_lost = udp.pointer("/end/sum/lost_packets").and_then(Value::as_u64).unwrap_or(u64::MAX);
    assert!(udp_packets > 100 && udp_lost < udp_packets, "UDP over rw0: {udp_packets} sent, {udp_lost} lost");

    let base = before["tx_bytes"].as_u64().unwrap();
    let after = rack.wait_counters("h2", "h3", |c| c["tx_bytes"].as_u64().unwrap() >= base + tcp_bytes);
    let sent = after["tx_bytes"].as_u64().unwrap() - base;
    assert!(sent >= tcp_bytes, "rw0 counted {sent} bytes to h3, iperf3 moved {tcp_bytes}");
    assert!(after["rx_packets"].as_u64().unwrap() > before["rx_packets"].as_u64().unwrap(), "no replies counted");
    assert_eq!(after["transport"], "shm", "hosts of one rack talk through shared memory");

    rack.iperf_server("far", "5413");
    let eth = rack.iperf("h2", &["-c", "198.18.0.4", "-p", "5413", "-t", "1"]);
    assert!(eth.pointer("/end/sum_received/bytes").and_then(Value::as_u64).unwrap_or(0) > 1_000_000);
    assert!(rack.peer_counters("h2", "far").is_none(), "the remote host must not be an rw0 peer");
}

const TWO_RACKS: &str = r#"
name = "NAME"
[[rail]]
mtu = 1500
[[host]]
name = "a1"
domain = "a"
[[host]]
name = "b1"
domain = "b"
"#;

/// Packets `host`'s rw0 counted so far one way (`rx`: taken in from its agent; `tx`: handed
/// to it).
fn rw0_packets(rack: &Rack, host: &str, way: &str) -> u64 {
    let o = rack.exec(host, &["ip", "-s", "-j", "link", "show", "rw0"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("ip -j link");
    v.pointer(&format!("/0/stats64/{way}/packets")).and_then(Value::as_u64).expect("rw0's counter")
}

// Checks small datagrams across racks over rw0, where the edge transport carries them: 64 B
// UDP datagrams, iperf3 pacing them at 20 Mbit/s (some 39,000 a second) for 1 s from a1 to b1,
// arrive (iperf3's own count: a thousand at least; a machine running the other rack tests at
// the same time drops many — half of them in one run — and how many is not the claim), b1's
// counters for a1 count at least every one that arrived, and b1's rw0 took them in fewer
// packets than datagrams: those of the flow received together went in as one packet, cut back
// into the datagrams by the kernel (iperf3 saw each). And datagrams a program sends with UDP
// segmentation offload cross whole and arrive cut (below).
#[test]
fn small_datagrams_across_racks_go_into_rw0_together() {
    if skip("small_datagrams_across_racks_go_into_rw0_together") {
        return;
    }
    let rack = Rack::up("tgro", TWO_RACKS);
    rack.wait_route("a1", "198.18.0.2", "rw0");
    rack.wait_route("b1", "198.18.0.1", "rw0");
    let before = rack.wait_counters("b1", "a1", |_| true);
    let rx_before = rw0_packets(&rack, "b1", "rx");
    rack.iperf_server("b1", "5421");
    let udp = rack.iperf("a1", &["-c", "198.18.0.2", "-p", "5421", "-u", "-b", "20M", "-l", "64", "-t", "1"]);
    let sent = udp.pointer("/end/sum/packets").and_then(Value::as_u64).unwrap_or(0);
    let lost = udp.pointer("/end/sum/lost_packets").and_then(Value::as_u64).unwrap_or(u64::MAX);
    assert!(sent > 10_000 && lost.saturating_add(1_000) <= sent, "{sent} datagrams sent, {lost} lost");
    let arrived = sent - lost;
    let base = before["rx_packets"].as_u64().unwrap();
    rack.wait_counters("b1", "a1", |c| c["rx_packets"].as_u64().unwrap() >= base + arrived);
    let writes = rw0_packets(&rack, "b1", "rx") - rx_before;
    assert!(writes < arrived, "{arrived} datagrams went into rw0 as {writes} packets");

    if !have("python3") {
        eprintln!("UDP segmentation offload over rw0 not checked: python3 is not installed");
        return;
    }
    // A program that sends with UDP segmentation offload (`UDP_SEGMENT`, as QUIC stacks do):
    // 50 sends of 9,993 bytes cut at 1,000 from a1 to b1. b1's receiver (a socket buffer large
    // enough for all) gets every one of the 500 datagrams, each whole (its length, and one
    // byte value throughout, the send's number), and a1's rw0 handed them to its agent in
    // fewer packets than datagrams: the sends went whole, the kernel at b1 cut them.
    let tx_before = rw0_packets(&rack, "a1", "tx");
    // The sender waits a second for the receiver, which runs meanwhile.
    let sender = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_millis(1_000));
        Command::new(env!("CARGO_BIN_EXE_rackwire"))
            .args(["rack", "exec", "a1", "--name", "tgro", "--", "python3", "-c", USO_SENDER])
            .output()
            .expect("run the sender")
    });
    let receiver = Command::new(env!("CARGO_BIN_EXE_rackwire"))
        .args(["rack", "exec", "b1", "--name", &rack.name, "--", "python3", "-c", USO_RECEIVER])
        .output();
    let received = ok(&receiver.expect("run the receiver"));
    ok(&sender.join().unwrap());
    assert_eq!(received.trim(), "500 499650 0", "datagrams, bytes, malformed");
    let handed = rw0_packets(&rack, "a1", "tx") - tx_before;
    assert!(handed < 500, "a1's rw0 handed over {handed} packets for 50 sends");
}

/// Sends 50 times 9,993 bytes (all of value i) to b1 (198.18.0.2:6100), cut at 1,000 bytes by
/// UDP segmentation offload (`UDP_SEGMENT`, 103).
const USO_SENDER: &str = "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_UDP, 103, 1000)
for i in range(50):
    s.sendto(bytes([i]) * 9993, ('198.18.0.2', 6100))
";

/// Receives on 198.18.0.2:6100 until 1 s passes without a datagram (10 s for the first);
/// prints the datagrams, their bytes, and how many were not 1,000 or 993 bytes of one value.
const USO_RECEIVER: &str = "
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind(('198.18.0.2', 6100))
s.settimeout(10)
n = b = bad = 0
try:
    while True:
        d = s.recv(65536)
        n += 1
        b += len(d)
        bad += len(d) not in (1000, 993) or d.count(d[0]) != len(d)
        s.settimeout(1)
except socket.timeout:
    pass
print(n, b, bad)
";

// Checks that killing one agent in the middle of streams leaves the rest working: a TCP stream
// between two other hosts over rw0 runs to its end at full length, and a stream to the host
// whose agent died carries on (its route falls back to Ethernet, same addresses) instead of
// breaking. Both iperf3 runs must end with data received over the whole time.
#[test]
fn killing_an_agent_leaves_the_others_flowing() {
    if skip("killing_an_agent_leaves_the_others_flowing") {
        return;
    }
    let rack = Rack::up("tkill", FOUR_HOSTS.replace("[[host]]\nname = \"far\"\nremote = true\n", "").as_str());
    rack.wait_route("h2", "198.18.0.4", "rw0");
    rack.wait_route("h2", "198.18.0.3", "rw0");
    rack.iperf_server("h4", "5421");
    rack.iperf_server("h3", "5422");
    let victim = rack.state["hosts"].as_array().unwrap().iter().find(|h| h["name"] == "h3").unwrap()["pids"][0]
        .as_u64()
        .unwrap();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| rack.iperf("h2", &["-c", "198.18.0.4", "-p", "5421", "-t", "4"]));
        let b = s.spawn(|| rack.iperf("h2", &["-c", "198.18.0.3", "-p", "5422", "-t", "4"]));
        std::thread::sleep(Duration::from_millis(1500));
        Command::new("kill").args(["-9", &victim.to_string()]).status().unwrap();
        (a.join().unwrap(), b.join().unwrap())
    });
    for (what, r) in [("h2 -> h4 over rw0", &a), ("h2 -> h3 (agent killed)", &b)] {
        assert!(r.get("error").is_none(), "{what}: {}", r["error"]);
        let secs = r.pointer("/end/sum_received/seconds").and_then(Value::as_f64).unwrap_or(0.0);
        let bytes = r.pointer("/end/sum_received/bytes").and_then(Value::as_u64).unwrap_or(0);
        assert!(secs > 3.5 && bytes > 10_000_000, "{what}: {bytes} bytes in {secs} s");
        // Data arrived in the last second too: the stream kept flowing after the kill.
        let last = r["intervals"]
            .as_array()
            .and_then(|i| i.last())
            .and_then(|i| i.pointer("/sum/bytes"))
            .and_then(Value::as_u64);
        assert!(last.unwrap_or(0) > 0, "{what}: nothing in the last interval");
    }
    rack.wait_route("h2", "198.18.0.3", "eth0");
    assert_eq!(rack.route_dev("h2", "198.18.0.4"), "rw0", "h4 is still reached over rw0");
}

/// Every row `bench vnic` promises, in the order it measures them.
const VNIC_ROWS: [&str; 19] = [
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

// Checks that the rack benchmarks run end to end at tiny scale (so they do not rot): `bench
// stripe` moves its stream byte-exact over two shaped rails and reports an edge row and an
// iperf3 row with positive rates; `bench --rack` runs ping-pong, one-way and two-way between
// the same rack's hosts over its rails; `bench vnic` reports every row it promises (when sockperf
// is installed) with positive figures, the bare UDP tunnel's cross-rack rows and the rows of
// small datagrams' highest rate across racks among them, its TCP and ping-pong rows with what
// each cost the machine and the ratio of rw0's cost to the veth's, and with `--host-cores --rows xrack-`
// just the cross-rack rows, and with `--mtu` (Marlin's Fig. 8) TCP and UDP over both at each MTU;
// `bench coll --rack` (hosts in memory domains of their
// own) gives `udp` rows for its collectives and, where Open MPI is installed, `openmpi-tcp`
// rows measured over the same rails, and takes its rack down.
#[test]
fn rack_benchmarks_run_end_to_end() {
    if skip("rack_benchmarks_run_end_to_end") {
        return;
    }
    let dir = TempDir::new("stripe");
    let cfg = dir.0.join("r.toml");
    // A rack name of its own, so the other tests' racks are not touched.
    std::fs::write(
        &cfg,
        "name = \"tstripe\"\n[[rail]]\nrate = \"1gbit\"\n[[rail]]\nrate = \"1gbit\"\n[[host]]\nname = \"h1\"\n[[host]]\nname = \"h2\"\n",
    )
    .unwrap();
    let out = ok(&rackwire(&[
        "bench",
        "stripe",
        "--config",
        cfg.to_str().unwrap(),
        "--mib",
        "8",
        "--scale",
        "0.2",
        "--json",
    ]));
    let v: Value = serde_json::from_str(&out).expect("bench stripe --json");
    let rate = |t: &str| row_figure(&v, t, "mb_per_s");
    assert!(rate("udp-2l").is_some_and(|r| r > 0.0), "{out}");
    assert!(rate("iperf3-tcp").is_some_and(|r| r > 0.0), "{out}");
    assert!(v["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap_or("").contains("byte-exact")));
    assert!(namespaces("rwr-tstripe-").is_empty(), "bench stripe left its rack up");

    // The RMA micro-benchmarks between the same rack's two hosts over its rails (MultiEdge's
    // Fig. 2): a row per pattern and size over the rails, each moving data; the rack goes down.
    let out = ok(&rackwire(&[
        "bench",
        "--rack",
        cfg.to_str().unwrap(),
        "--pattern",
        "pingpong,oneway,twoway",
        "--size",
        "64,64K",
        "--scale",
        "0.02",
        "--json",
    ]));
    let v: Value = serde_json::from_str(&out).expect("bench --rack --json");
    for pattern in ["pingpong", "oneway", "twoway"] {
        for size in [64, 65536] {
            let row = v["rows"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["transport"] == "rails" && r["pattern"] == pattern && r["size"] == size);
            assert!(row.is_some_and(|r| r["mb_per_s"].as_f64().is_some_and(|m| m > 0.0)), "{pattern} {size}: {out}");
        }
    }
    assert!(namespaces("rwr-tstripe-").is_empty(), "bench --rack left its rack up");

    let coll_cfg = dir.0.join("c.toml");
    std::fs::write(
        &coll_cfg,
        "name = \"tcoll\"\n[[rail]]\n[[host]]\nname = \"h1\"\ndomain = \"h1\"\n[[host]]\nname = \"h2\"\ndomain = \"h2\"\n",
    )
    .unwrap();
    let mut args = vec!["bench", "coll", "--rack", coll_cfg.to_str().unwrap(), "--ranks", "2"];
    args.extend(["--op", "alltoallv,barrier", "--size", "8,64K", "--scale", "0.05", "--json"]);
    let peers = have("mpicc") && have("mpirun");
    if peers {
        args.push("--peers");
    }
    let out = ok(&rackwire(&args));
    let v: Value = serde_json::from_str(&out).expect("bench coll --json");
    let rows = v["rows"].as_array().unwrap();
    for t in ["udp"].into_iter().chain(peers.then_some("openmpi-tcp")) {
        for (op, size) in [("alltoallv", 8), ("alltoallv", 65536), ("barrier", 0)] {
            assert!(
                rows.iter().any(|r| r["transport"] == t
                    && r["pattern"] == op
                    && r["size"] == size
                    && r["lat_us_avg"].as_f64().is_some_and(|x| x > 0.0)),
                "no {t} {op} {size} row: {out}"
            );
        }
    }
    assert!(namespaces("rwr-tcoll-").is_empty(), "bench coll left its rack up");

    if !have("sockperf") {
        eprintln!("bench vnic not run: sockperf is not installed");
        return;
    }
    let out = ok(&rackwire(&["bench", "vnic", "--scale", "0.2", "--json"]));
    let v: Value = serde_json::from_str(&out).expect("bench vnic --json");
    for t in VNIC_ROWS {
        let figure = row_figure(&v, t, "mb_per_s").or(row_figure(&v, t, "lat_us_avg"));
        assert!(figure.is_some_and(|f| f > 0.0), "row {t} missing or empty: {out}");
    }
    // Each comparison's ratio is reported from the one run, with its median and spread.
    let ratios = v["meta"]["ratios"].as_object().expect("ratios in the meta");
    let cross = ratios.values().find(|r| r["ours"] == "xrack-vnic-tcp").expect("the cross-rack TCP ratio");
    assert_eq!(cross["runs"].as_array().map(Vec::len), Some(1));
    assert!(cross["median"].as_f64().is_some_and(|m| m > 0.0), "{cross}");
    // The bare TUN relay's and the bare UDP tunnel's own ratios are there too (the tunnel's
    // rows above carried sockperf's ping-pong both ways, over UDP and TCP), and their devices
    // went with the rack.
    assert!(ratios.values().any(|r| r["ours"] == "vnic-tcp" && r["theirs"] == "tun-relay-tcp"), "{ratios:?}");
    assert!(ratios.values().any(|r| r["ours"] == "xrack-vnic-udp" && r["theirs"] == "xrack-tunnel-udp"), "{ratios:?}");
    // Small datagrams across racks at the highest rate carried: rw0 against the veth.
    assert!(ratios.values().any(|r| r["ours"] == "xrack-vnic-rate" && r["theirs"] == "xrack-veth-rate"), "{ratios:?}");
    // Each TCP stream's row says what it cost the machine (busy core-seconds per 10^9 bytes:
    // some, and under 100, which would be a core busy for 10 s per 100 MB), and the costs of
    // rw0 and the veth are compared.
    for t in ["vnic-tcp", "veth-tcp", "tun-relay-tcp"] {
        let cost = row_figure(&v, t, "core_s_per_gb");
        assert!(cost.is_some_and(|c| c > 0.0 && c < 100.0), "{t}: core-seconds per GB {cost:?}");
    }
    let costs = |(name, r): (&String, &Value)| {
        name.contains("core-seconds") && r["ours"] == "vnic-tcp" && r["theirs"] == "veth-tcp"
    };
    assert!(ratios.iter().any(costs), "{ratios:?}");
    // And each ping-pong's row what a round trip cost it (some core time, under a second).
    for t in ["vnic-sockperf", "veth-sockperf", "xrack-vnic-udp", "xrack-veth-udp"] {
        let cost = row_figure(&v, t, "core_us_per_op");
        assert!(cost.is_some_and(|c| c > 0.0 && c < 1e6), "{t}: core-µs per round trip {cost:?}");
    }
    assert!(namespaces("rwr-bvnic-").is_empty(), "bench vnic left its rack up");

    // With each host on a core of its own and only the cross-rack rows: those nine rows, in
    // order, and no other, the relay's and the tunnel's threads started on their hosts' cores
    // (a failure to hold one would fail the run), and the note naming each host's core.
    let out = ok(&rackwire(&["bench", "vnic", "--scale", "0.2", "--host-cores", "--rows", "xrack-", "--json"]));
    let v: Value = serde_json::from_str(&out).expect("bench vnic --host-cores --json");
    let names: Vec<&str> = v["rows"].as_array().unwrap().iter().filter_map(|r| r["transport"].as_str()).collect();
    let want: Vec<&str> = VNIC_ROWS.into_iter().filter(|r| r.starts_with("xrack-")).collect();
    assert_eq!(names, want, "{out}");
    assert_eq!(v["meta"]["host_cores"], true);
    let notes = v["notes"].as_array().unwrap();
    assert!(notes.iter().any(|n| n.as_str().is_some_and(|n| n.contains("h1 on core"))), "{out}");
    assert!(namespaces("rwr-bvnic-").is_empty(), "bench vnic --host-cores left its rack up");

    // Marlin's Fig. 8: at each MTU asked for, TCP and UDP over rw0 and over the veth with both
    // at that MTU, each a positive rate, with the two ratios; the racks taken down; and an MTU
    // past rw0's own refused with the range.
    let out = ok(&rackwire(&["bench", "vnic", "--mtu", "1500,9000", "--scale", "0.2", "--json"]));
    let v: Value = serde_json::from_str(&out).expect("bench vnic --mtu --json");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["mtu"].as_u64().unwrap()).collect::<Vec<_>>(), [1500, 9000], "{out}");
    for r in rows {
        for k in ["vnic-tcp_mb_s", "veth-tcp_mb_s", "vnic-udp_mb_s", "veth-udp_mb_s"] {
            assert!(r[k]["median"].as_f64().is_some_and(|x| x > 0.0), "{k} at MTU {}: {out}", r["mtu"]);
        }
        for k in ["tcp_vnic_over_veth", "udp_vnic_over_veth"] {
            assert!(r[k]["median"].as_f64().is_some_and(|x| x > 0.0), "{k}: {out}");
        }
    }
    assert!(namespaces("rwr-bvmtu-").is_empty(), "bench vnic --mtu left its rack up");
    let o = rackwire(&["bench", "vnic", "--mtu", "70000"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("1280..=65520"), "{e}");
}

// Checks end to end that a peer cannot speak for another node over rw0: a node on h3 sends
// h2's agent, as a fabric message, an IPv4 packet whose source is h1's address; h2's agent
// drops it and counts it (`rx_spoofed` in its counters) instead of writing it into rw0.
#[test]
fn a_packet_speaking_for_another_node_is_dropped_and_counted() {
    if skip("a_packet_speaking_for_another_node_is_dropped_and_counted") {
        return;
    }
    let rack = Rack::up("tspoof", THREE_AND_REMOTE.replace("[[host]]\nname = \"far\"\nremote = true\n", "").as_str());
    // h2 knows h1 and h3 (and so who registered which address).
    rack.wait_route("h2", "198.18.0.1", "rw0");
    rack.wait_route("h2", "198.18.0.3", "rw0");
    let spoofed = |s: &Value| {
        s["hosts"]
            .as_array()
            .and_then(|h| h.iter().find(|h| h["name"] == "h2")?.pointer("/agent/vnic/rx_spoofed")?.as_u64())
    };
    assert_eq!(spoofed(&rack.status()), Some(0), "nothing spoofed yet");
    // An offload header (none), then UDP from 198.18.0.1 (h1's) to 198.18.0.2 (h2's).
    let mut packet = vec![0u8; 10];
    let mut ip = [0u8; 28];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&28u16.to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&[198, 18, 0, 1]);
    ip[16..20].copy_from_slice(&[198, 18, 0, 2]);
    packet.extend_from_slice(&ip);
    let hex: String = packet.iter().map(|b| format!("{b:02x}")).collect();
    let bin = env!("CARGO_BIN_EXE_rackwire");
    ok(&rack.exec("h3", &[bin, "send-raw", "--name", "spoofer", "--to", "h2", "--hex", &hex]));
    let deadline = Instant::now() + ROUTE_WAIT;
    while spoofed(&rack.status()) != Some(1) {
        assert!(Instant::now() < deadline, "h2 never counted the spoofed packet: {:?}", spoofed(&rack.status()));
        std::thread::sleep(Duration::from_millis(100));
    }
}
