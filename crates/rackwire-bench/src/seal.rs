//! `rackwire bench seal`: what sealing edge frames costs. The RMA benchmark's 64-byte
//! ping-pong and 1 MiB one-way writes over one loopback link, with frames sealed and with
//! them unsealed (both ends turn it off, which only a measurement should do), alternated in
//! each repeat so that both see the same machine; the cost is the difference per repeat, given
//! as its median and spread.

use crate::{BenchTransport, Pattern, Row, ShmBench};
use anyhow::{bail, Result};

use crate::repeat::median_spread;

/// Frames of an Ethernet link (1500-byte MTU less IPv4 and UDP headers).
pub const MTU_DEFAULT: usize = 1472;
/// Repeats at most.
const REPEAT_MAX: usize = 50;
/// The ping-pong's message size.
const LATENCY_BYTES: u64 = 64;
/// The one-way writes' size.
const BANDWIDTH_BYTES: u64 = 1 << 20;

fn measure(sealed: bool, mtu: usize, scale: f64) -> Result<(f64, f64)> {
    let cfg = ShmBench {
        transport: BenchTransport::Udp { links: 1, mtu, sealed },
        patterns: vec![Pattern::Pingpong, Pattern::Oneway],
        sizes: vec![LATENCY_BYTES, BANDWIDTH_BYTES],
        progress: false,
        scale,
        ..ShmBench::default()
    };
    let report = crate::run_shm(&cfg)?;
    let find = |pattern: &str, size: u64| -> Option<&Row> {
        report.rows.iter().find(|r| r.pattern == pattern && r.size == size && r.transport.starts_with("udp"))
    };
    let lat = find("pingpong", LATENCY_BYTES).and_then(|r| r.lat_us_p50);
    let bw = find("oneway", BANDWIDTH_BYTES).and_then(|r| r.mb_per_s);
    match (lat, bw) {
        (Some(l), Some(b)) => Ok((l, b)),
        _ => bail!("the benchmark gave no 64 B ping-pong or 1 MiB one-way row"),
    }
}

/// `rackwire bench seal`.
pub fn run(mtu: usize, repeat: usize, scale: f64, json: bool) -> Result<()> {
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    if !(256..=65507).contains(&mtu) {
        bail!("--mtu must be 256..=65507");
    }
    // Per repeat: (sealed latency, unsealed latency, sealed MB/s, unsealed MB/s), the order of
    // the two runs swapped every other repeat.
    let mut runs = Vec::new();
    for rep in 0..repeat {
        let first_sealed = rep % 2 == 0;
        let a = measure(first_sealed, mtu, scale)?;
        let b = measure(!first_sealed, mtu, scale)?;
        let (s, u) = if first_sealed { (a, b) } else { (b, a) };
        runs.push((s.0, u.0, s.1, u.1));
    }
    let col = |f: fn(&(f64, f64, f64, f64)) -> f64| median_spread(&mut runs.iter().map(f).collect::<Vec<_>>());
    let lat_sealed = col(|r| r.0);
    let lat_plain = col(|r| r.1);
    let lat_cost = col(|r| r.0 - r.1);
    let bw_sealed = col(|r| r.2);
    let bw_plain = col(|r| r.3);
    let bw_cost = col(|r| 100.0 * (1.0 - r.2 / r.3));
    if json {
        let triple = |t: (f64, f64, f64)| serde_json::json!({ "median": t.0, "lo": t.1, "hi": t.2 });
        let doc = serde_json::json!({
            "meta": { "command": std::env::args().collect::<Vec<_>>().join(" "), "mtu": mtu, "repeats": repeat },
            "lat_us_p50_64b": { "sealed": triple(lat_sealed), "unsealed": triple(lat_plain), "cost_us": triple(lat_cost) },
            "mb_per_s_1mib": { "sealed": triple(bw_sealed), "unsealed": triple(bw_plain), "cost_pct": triple(bw_cost) },
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let mut t = crate::table();
    t.set_header(["edge transport, one loopback link", "sealed", "unsealed", "cost (spread)"]);
    let f = |t: (f64, f64, f64), d: usize| format!("{:.*} ({:.*}–{:.*})", d, t.0, d, t.1, d, t.2);
    t.add_row([
        "64 B ping-pong, p50 one-way µs".to_string(),
        f(lat_sealed, 2),
        f(lat_plain, 2),
        format!("{} µs", f(lat_cost, 2)),
    ]);
    t.add_row([
        "1 MiB one-way writes, MB/s".to_string(),
        f(bw_sealed, 0),
        f(bw_plain, 0),
        format!("{} %", f(bw_cost, 1)),
    ]);
    println!("{t}");
    println!(
        "({repeat} repeats, sealed and unsealed alternated; frames of {mtu} bytes; cost per repeat, median and spread)"
    );
    Ok(())
}
