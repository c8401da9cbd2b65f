//! Peer rows, measured in the same run as ours at the same sizes and patterns: UCX's
//! `ucx_perftest` (over shared memory or TCP), and for the network transports iperf3 (TCP,
//! one stream), sockperf (UDP ping-pong) and libfabric's `fi_pingpong` (`udp;ofi_rxd`, `tcp`).

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rackwire_rack::cores::on_cores;

use crate::report::{Report, Row};
use crate::stats::iterations;
use crate::Pattern;

/// How long one UCX measurement may take.
const UCX_RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// UCX prints bandwidth in MiB/s; rows use 10^6 bytes/s.
const MIB_IN_MB: f64 = 1.048_576;

fn installed(tool: &str) -> bool {
    Command::new(tool).arg("-h").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

fn free_port() -> Option<u16> {
    TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok().map(|a| a.port())
}

/// Fields of UCX's `Final:` line: iterations, latency p50 / average / overall (µs),
/// bandwidth average / overall (MiB/s), message rate average / overall.
fn parse_final(out: &str) -> Option<[f64; 8]> {
    let line = out.lines().find(|l| l.trim_start().starts_with("Final:"))?;
    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|w| w.parse().ok()).collect();
    v.try_into().ok()
}

/// Run one `ucx_perftest` client against a fresh server; the `Final:` numbers.
fn run_ucx(tls: &str, test: &str, size: u64, iters: u64) -> Result<[f64; 8], String> {
    let port = free_port().ok_or("no free port")?.to_string();
    let mut server = Command::new("ucx_perftest")
        .args(["-p", &port])
        .env("UCX_TLS", tls)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    std::thread::sleep(Duration::from_millis(700));
    let mut client = Command::new("ucx_perftest")
        .args(["127.0.0.1", "-p", &port, "-t", test, "-s", &size.to_string(), "-n", &iters.to_string()])
        .env("UCX_TLS", tls)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + UCX_RUN_TIMEOUT;
    let status = loop {
        if let Some(st) = client.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = client.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut out = String::new();
    if let Some(mut o) = client.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    let _ = server.kill();
    let _ = server.wait();
    let _ = client.wait();
    match status {
        None => Err(format!("{test} at {size} B timed out")),
        Some(_) => parse_final(&out).ok_or_else(|| format!("{test} at {size} B printed no result")),
    }
}

/// `transport` rows (`ucx-posix`, `ucx-tcp`) from `ucx_perftest` with `UCX_TLS=tls`, for the
/// patterns UCX has a counterpart for.
pub(crate) fn ucx_rows(
    tls: &str,
    transport: &str,
    patterns: &[Pattern],
    sizes: &[u64],
    scale: f64,
    report: &mut Report,
) {
    if !installed("ucx_perftest") {
        report.notes.push(format!("ucx_perftest is not installed (Debian: ucx-utils); {transport} rows skipped"));
        return;
    }
    // (pattern, ucx_perftest test, row transport): ping-pong twice, as tagged messages (the
    // counterpart of a write with a notification) and as puts whose receiver polls its memory
    // (`-put`, the counterpart of a pinned write with a signal word).
    let put = format!("{transport}-put");
    let mut tests = Vec::new();
    for &p in patterns {
        match p {
            Pattern::Pingpong => {
                tests.push((p, "tag_lat", transport));
                tests.push((p, "ucp_put_lat", put.as_str()));
            }
            Pattern::Oneway => tests.push((p, "ucp_put_bw", transport)),
            Pattern::Rate => tests.push((p, "tag_bw", transport)),
            Pattern::Twoway | Pattern::Table1 | Pattern::Pieces => {
                report.notes.push(format!("ucx_perftest has no {} counterpart; no ucx-posix rows for it", p.name()));
            }
        }
    }
    for (p, test, transport) in tests {
        let name = p.name();
        for &size in sizes {
            let iters = match p {
                Pattern::Pingpong => crate::stats::pingpong_iters(size, scale).0,
                _ => iterations((4e9 * scale) as u64, size, 100, 1_000_000),
            };
            match run_ucx(tls, test, size, iters) {
                Ok([n, p50, avg, _, bw, _, rate, _]) => report.rows.push(Row {
                    transport: transport.into(),
                    pattern: name.into(),
                    size,
                    iters: n as u64,
                    lat_us_p50: (p == Pattern::Pingpong).then_some(p50),
                    lat_us_avg: Some(avg),
                    mb_per_s: Some(bw * MIB_IN_MB),
                    msgs_per_s: Some(rate),
                    ..Row::default()
                }),
                Err(e) => report.notes.push(format!("{transport} {name}: {e}")),
            }
        }
    }
}

/// Start `server`, give it time to listen, run `client` with a time limit; the client's
/// standard output. The server is killed afterwards. Each starts on its cores (empty: any).
fn run_pair(server: (Command, &[usize]), client: (Command, &[usize]), limit: Duration) -> Result<String, String> {
    run_pair_measured(server, client, limit).map(|(out, _)| out)
}

/// [`run_pair`], and the core-seconds the whole machine was busy while the client ran (see
/// `crate::cpu`; `None` where that cannot be read).
fn run_pair_measured(
    server: (Command, &[usize]),
    client: (Command, &[usize]),
    limit: Duration,
) -> Result<(String, Option<f64>), String> {
    let spawn = |(mut c, cores): (Command, &[usize]), out: Stdio| {
        c.stdout(out).stderr(Stdio::null());
        on_cores(cores, || c.spawn()).and_then(|r| r).map_err(|e| e.to_string())
    };
    let mut srv = spawn(server, Stdio::null())?;
    std::thread::sleep(Duration::from_millis(700));
    let cpu = crate::cpu::MachineCpu::now();
    let mut cli = spawn(client, Stdio::piped())?;
    let deadline = Instant::now() + limit;
    let finished = loop {
        match cli.try_wait() {
            Ok(Some(_)) => break true,
            Ok(None) if Instant::now() > deadline => break false,
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.to_string()),
        }
    };
    let busy = cpu.and_then(|c| c.busy_since());
    let mut out = String::new();
    if let Some(mut o) = cli.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    let _ = cli.kill();
    let _ = cli.wait();
    let _ = srv.kill();
    let _ = srv.wait();
    if finished {
        Ok((out, busy))
    } else {
        Err("timed out".into())
    }
}

fn number_after(text: &str, key: &str) -> Option<f64> {
    let i = text.find(key)? + key.len();
    let rest = text[i..].trim_start_matches(|c: char| c.is_whitespace() || c == '=');
    let end = rest.find(|c: char| !(c.is_ascii_digit() || ".eE+-".contains(c))).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Where a peer tool runs: the server's and the client's network namespaces (none: this one)
/// and cores (empty: any; a virtual host's, see `rackwire_rack::cores`), and the address the
/// client reaches the server at.
#[derive(Clone, Debug, Default)]
pub struct NetPath {
    /// Namespace of the server.
    pub server_ns: Option<String>,
    /// Namespace of the client.
    pub client_ns: Option<String>,
    /// Server address.
    pub addr: String,
    /// Cores the server runs on.
    pub server_cores: Vec<usize>,
    /// Cores the client runs on.
    pub client_cores: Vec<usize>,
}

impl NetPath {
    /// Both ends on this machine's loopback.
    pub fn loopback() -> NetPath {
        NetPath { addr: "127.0.0.1".into(), ..NetPath::default() }
    }
}

fn in_ns(ns: &Option<String>, prog: &str) -> Command {
    match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, prog]);
            c
        }
        None => Command::new(prog),
    }
}

/// iperf3, one TCP stream from client to server over `path` with `size`-byte writes, for
/// `secs` seconds; the rate received, named `transport`, and what it cost the machine.
pub fn iperf3_path(path: &NetPath, size: u64, secs: u64, transport: &str) -> Result<Row, String> {
    let (out, busy) = iperf3_run(path, size, secs, None)?;
    let end = out.find("\"sum_received\"").ok_or("iperf3 printed no result")?;
    let rate = number_after(&out[end..], "\"bits_per_second\":").ok_or("iperf3 result without a rate")?;
    let bytes = number_after(&out[end..], "\"bytes\":");
    let mut row = oneway_row(transport, size, rate / 8.0 / 1e6);
    row.core_s_per_gb = busy.zip(bytes).and_then(|(busy, bytes)| crate::cpu::core_seconds_per_gb(busy, bytes));
    Ok(row)
}

/// The most datagrams lost that a UDP rate counts as carried by its path (percent).
pub const UDP_LOSS_MAX_PERCENT: f64 = 1.0;
/// How [`iperf3_udp_capacity`] searches: the rate it tries first (bits per second), doubled
/// while the loss stays under the bound, then halving the gap; and how many rates it tries.
#[derive(Clone, Copy, Debug)]
pub struct UdpSearch {
    /// Bits per second of the first run.
    pub first_rate: f64,
    /// Runs in all.
    pub probes: usize,
}

/// The search for large datagrams: from above what any path here carries.
pub const UDP_SEARCH_LARGE: UdpSearch = UdpSearch { first_rate: 4e9, probes: 5 };
/// The search for 64 B datagrams: from some 98,000 a second, below what one core's iperf3
/// sends here (a search from 4 Gbit/s would spend every probe above it), with two probes more
/// than the large one's: its last gap is 2–12% of the rates found here (100,000–400,000 a
/// second).
pub const UDP_SEARCH_SMALL: UdpSearch = UdpSearch { first_rate: 5e7, probes: 7 };

/// Socket buffers of a UDP run (iperf3 `-w`), as its users size them for a fast UDP test: with
/// the default (208 KiB here), a few 60000-byte datagrams of one of iperf3's paced bursts fill
/// the receiver's and the rest is dropped at any rate (2 Gbit/s over rw0: 5.4% lost, with
/// 4 MiB none).
const UDP_SOCKET_BUFFER: &str = "4M";

/// iperf3 UDP over `path`, `size`-byte datagrams, at the highest rate that path carries with at
/// most `UDP_LOSS_MAX_PERCENT` (1%) lost: `search.probes` runs of `secs` seconds, each at a set rate
/// (iperf3 `-b`, paced as its users pace UDP, with socket buffers of `UDP_SOCKET_BUFFER`), doubling from `search.first_rate` while the loss
/// stays under the bound and halving the gap to the last rate that kept it after one that did
/// not. The row is the rate received at the best rate kept; an error when none was. Sent
/// unpaced, datagrams measure how much the receiving end drops when flooded, which depends on
/// who gets the cores, not on the path.
pub fn iperf3_udp_capacity(
    path: &NetPath,
    size: u64,
    secs: u64,
    search: UdpSearch,
    transport: &str,
) -> Result<Row, String> {
    let (mut kept, mut lost_at): (f64, Option<f64>) = (0.0, None);
    let mut rate = search.first_rate;
    let mut best: Option<f64> = None;
    for _ in 0..search.probes {
        let (out, _) = iperf3_run(path, size, secs, Some(rate))?;
        let end = out.find("\"end\"").ok_or("iperf3 printed no result")?;
        let sum = out[end..].find("\"sum\"").map(|i| end + i).ok_or("iperf3 printed no sum")?;
        let sent = number_after(&out[sum..], "\"bits_per_second\":").ok_or("iperf3 result without a rate")?;
        let lost = number_after(&out[sum..], "\"lost_percent\":").ok_or("iperf3 result without a loss")?;
        if lost <= UDP_LOSS_MAX_PERCENT {
            let received = sent * (1.0 - lost / 100.0) / 8.0 / 1e6;
            best = Some(best.map_or(received, |b: f64| b.max(received)));
            kept = kept.max(rate);
        } else {
            lost_at = Some(lost_at.map_or(rate, |l: f64| l.min(rate)));
        }
        rate = match lost_at {
            None => rate * 2.0,
            Some(l) if kept > 0.0 => (kept + l) / 2.0,
            Some(l) => l / 2.0,
        };
    }
    let best = best.ok_or_else(|| format!("every rate tried lost over {UDP_LOSS_MAX_PERCENT}% of the datagrams"))?;
    let mut row = oneway_row(transport, size, best);
    row.msgs_per_s = Some(best * 1e6 / size.max(1) as f64);
    Ok(row)
}

/// Run iperf3's client against a fresh server over `path` (`udp_rate`: UDP at that many bits
/// per second); its JSON output, and the core-seconds the machine was busy while it ran.
fn iperf3_run(path: &NetPath, size: u64, secs: u64, udp_rate: Option<f64>) -> Result<(String, Option<f64>), String> {
    let port = free_port().ok_or("no free port")?.to_string();
    let mut server = in_ns(&path.server_ns, "iperf3");
    server.args(["-s", "-1", "-p", &port]);
    let mut client = in_ns(&path.client_ns, "iperf3");
    client.args(["-c", &path.addr, "-p", &port, "-l", &size.to_string(), "-t", &secs.to_string(), "-J"]);
    if let Some(rate) = udp_rate {
        client.args(["-u", "-b", &format!("{}", rate as u64), "-w", UDP_SOCKET_BUFFER]);
    }
    run_pair_measured((server, &path.server_cores), (client, &path.client_cores), Duration::from_secs(secs + 30))
}

fn oneway_row(transport: &str, size: u64, mb_per_s: f64) -> Row {
    Row {
        transport: transport.into(),
        pattern: "oneway".into(),
        size,
        iters: 0,
        mb_per_s: Some(mb_per_s),
        ..Row::default()
    }
}

/// sockperf UDP (or, with `tcp`, TCP) ping-pong at `size` over `path`: half round trips, as
/// sockperf reports them, one message after another's answer (sockperf's default for a
/// ping-pong), each end sleeping in `epoll` for the next; and the machine's busy time per
/// round trip, over the client's whole run (its warm-up included, as the count of messages
/// is). `busy_poll` has both ends spin on non-blocking sockets (`--nonblocked`, and
/// `--mps=max` said outright): the match for rackwire's busy-poll mode.
pub fn sockperf_path(
    path: &NetPath,
    size: u64,
    secs: u64,
    busy_poll: bool,
    tcp: bool,
    transport: &str,
) -> Result<Row, String> {
    let port = free_port().ok_or("no free port")?.to_string();
    let mut server = in_ns(&path.server_ns, "sockperf");
    server.args(["server", "-i", &path.addr, "-p", &port]);
    let mut client = in_ns(&path.client_ns, "sockperf");
    client.args(["ping-pong", "-i", &path.addr, "-p", &port, "-m", &size.to_string(), "-t", &secs.to_string()]);
    if tcp {
        server.arg("--tcp");
        client.arg("--tcp");
    }
    if busy_poll {
        server.arg("--nonblocked");
        client.args(["--nonblocked", "--mps=max"]);
    }
    let (out, busy) =
        run_pair_measured((server, &path.server_cores), (client, &path.client_cores), Duration::from_secs(secs + 30))?;
    let avg = number_after(&out, "avg-latency").ok_or("sockperf printed no latency")?;
    let p50 = number_after(&out, "percentile 50.000");
    let p99 = number_after(&out, "percentile 99.000");
    let n = number_after(&out, "SentMessages").unwrap_or(0.0) as u64;
    Ok(Row {
        transport: transport.into(),
        pattern: "pingpong".into(),
        size,
        iters: n,
        lat_us_p50: p50,
        lat_us_p99: p99,
        lat_us_avg: Some(avg),
        mb_per_s: Some(size as f64 / avg / 1.0),
        core_us_per_op: busy.and_then(|b| crate::cpu::core_us_per_op(b, n)),
        ..Row::default()
    })
}

/// libfabric `fi_pingpong` over `provider` at `size`.
fn fabtests_row(provider: &str, transport: &str, size: u64, iters: u64) -> Result<Row, String> {
    let args = ["-p", provider, "-e", "rdm", "-I", &iters.to_string(), "-S", &size.to_string()];
    let mut server = Command::new("fi_pingpong");
    server.args(args);
    let mut client = Command::new("fi_pingpong");
    client.args(args).arg("127.0.0.1");
    let out = run_pair((server, &[]), (client, &[]), Duration::from_secs(120))?;
    let lines: Vec<&str> = out.lines().collect();
    let h = lines.iter().position(|l| l.contains("usec/xfer")).ok_or("fi_pingpong printed no result")?;
    let head: Vec<&str> = lines[h].split_whitespace().collect();
    let vals: Vec<&str> = lines.get(h + 1).ok_or("fi_pingpong result line missing")?.split_whitespace().collect();
    let col =
        |name: &str| head.iter().position(|c| *c == name).and_then(|i| vals.get(i)).and_then(|v| v.parse::<f64>().ok());
    Ok(Row {
        transport: transport.into(),
        pattern: "pingpong".into(),
        size,
        iters,
        lat_us_avg: col("usec/xfer"),
        mb_per_s: col("MB/sec"),
        ..Row::default()
    })
}

/// Peer rows for the network transports.
pub(crate) fn network_rows(patterns: &[Pattern], sizes: &[u64], scale: f64, report: &mut Report) {
    ucx_rows("tcp,self", "ucx-tcp", patterns, sizes, scale, report);
    let secs = ((3.0 * scale).round() as u64).clamp(1, 10);
    let push = |r: Result<Row, String>, what: String, report: &mut Report| match r {
        Ok(row) => report.rows.push(row),
        Err(e) => report.notes.push(format!("{what}: {e}")),
    };
    for &size in sizes {
        if patterns.contains(&Pattern::Oneway) && installed("iperf3") {
            push(iperf3_path(&NetPath::loopback(), size, secs, "iperf3-tcp"), format!("iperf3-tcp {size}"), report);
        }
        if patterns.contains(&Pattern::Pingpong) {
            if installed("sockperf") && size <= 65_000 {
                if !report.notes.iter().any(|n| n.starts_with("sockperf-udp")) {
                    report.notes.push(
                        "sockperf-udp: plain UDP datagrams, both ends busy-polling (no reliability, \
                         no remote memory): the kernel's own floor for a ping-pong"
                            .into(),
                    );
                }
                push(
                    sockperf_path(&NetPath::loopback(), size, secs, true, false, "sockperf-udp"),
                    format!("sockperf-udp {size}"),
                    report,
                );
            }
            if installed("fi_pingpong") {
                let iters = iterations((2e8 * scale) as u64, size, 200, 20_000);
                push(
                    fabtests_row("udp;ofi_rxd", "libfabric-rxd", size, iters),
                    format!("libfabric-rxd {size}"),
                    report,
                );
                push(fabtests_row("tcp", "libfabric-tcp", size, iters), format!("libfabric-tcp {size}"), report);
            }
        }
    }
    for (tool, pkg) in [("iperf3", "iperf3"), ("sockperf", "sockperf"), ("fi_pingpong", "libfabric-bin")] {
        if !installed(tool) {
            report.notes.push(format!("{tool} is not installed (Debian: {pkg}); its rows skipped"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks parsing of UCX's result line (a line as ucx_perftest prints it).
    #[test]
    fn parses_ucx_final_line() {
        let out = "junk\nFinal:                100000      0.349     0.396     0.396       19.28      19.28     2527161     2527161\n";
        let v = parse_final(out).unwrap();
        assert_eq!(v[0], 100000.0);
        assert_eq!(v[1], 0.349);
        assert_eq!(v[4], 19.28);
        assert!(parse_final("no result here").is_none());
    }

    // Checks the number scraping used on iperf3, sockperf and fi_pingpong output.
    #[test]
    fn scrapes_numbers_after_keys() {
        assert_eq!(number_after("sockperf: ====> avg-latency=12.345 (std-dev=1.2)", "avg-latency"), Some(12.345));
        assert_eq!(number_after("\"bits_per_second\":  9.5e9,", "\"bits_per_second\":"), Some(9.5e9));
        assert_eq!(number_after("\"bits_per_second\":\t4.18e+10,", "\"bits_per_second\":"), Some(4.18e10));
        assert_eq!(number_after("nothing", "avg-latency"), None);
    }
}
