//! Peer rows: UCX's `ucx_perftest` over its shared-memory transport, in the same run.

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// `ucx-posix` rows for the patterns UCX has a counterpart for.
pub(crate) fn ucx_rows(patterns: &[Pattern], sizes: &[u64], scale: f64, report: &mut Report) {
    if !installed("ucx_perftest") {
        report.notes.push("ucx_perftest is not installed (Debian: ucx-utils); ucx-posix rows skipped".into());
        return;
    }
    for &p in patterns {
        let (test, name) = match p {
            Pattern::Pingpong => ("tag_lat", "pingpong"),
            Pattern::Oneway => ("ucp_put_bw", "oneway"),
            Pattern::Rate => ("tag_bw", "rate"),
            Pattern::Twoway | Pattern::Table1 => {
                report.notes.push(format!("ucx_perftest has no {} counterpart; no ucx-posix rows for it", p.name()));
                continue;
            }
        };
        for &size in sizes {
            let iters = match p {
                Pattern::Pingpong => {
                    iterations((2e9 * scale) as u64, size, 200, (100_000.0 * scale).max(1000.0) as u64)
                }
                _ => iterations((4e9 * scale) as u64, size, 100, 1_000_000),
            };
            match run_ucx("posix,self", test, size, iters) {
                Ok([n, p50, avg, _, bw, _, rate, _]) => report.rows.push(Row {
                    transport: "ucx-posix".into(),
                    pattern: name.into(),
                    size,
                    iters: n as u64,
                    lat_us_p50: (p == Pattern::Pingpong).then_some(p50),
                    lat_us_avg: Some(avg),
                    mb_per_s: Some(bw * MIB_IN_MB),
                    msgs_per_s: Some(rate),
                    ..Row::default()
                }),
                Err(e) => report.notes.push(format!("ucx-posix {name}: {e}")),
            }
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
}
