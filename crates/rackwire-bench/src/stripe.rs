//! `rackwire bench stripe --config RACK`: the edge transport striped over a rack's shaped
//! rails, against one iperf3 TCP stream over one of those rails, in the same run.
//!
//! The rack (MultiEdge's 1L-1G, 2L-1G or 1L-10G from `examples/racks/`) comes up with its
//! first two hosts in different memory domains and without virtual NICs, so they reach each
//! other only over the edge transport on their rails. A writer in the first host streams
//! seeded patterns into a region of the second (at most 64 MiB, wrapped around), 1 MiB writes
//! with up to 32 in flight, each MiB of the region getting its own bytes and its last write
//! other bytes again; the owner checks every byte of the region once the last write has
//! notified it. The rails' nominal rate is the limit.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::repeat::median_spread;
use crate::{iperf3_path, print_table, NetPath, Report, Row};
use anyhow::{bail, Context, Result};
use rackwire::{Access, Bytes, Fabric, OpFlags};
use rackwire_rack::{rate_bytes_per_s, RackConfig};

/// Bytes per write.
const CHUNK: u64 = 1 << 20;
/// Writes in flight.
const IN_FLIGHT: usize = 32;
/// How long the two sides wait for each other.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// Name under which the owner publishes its region.
const REGION_NAME: &str = "stripe/target";
/// Pattern seed.
const SEED: u64 = 7;
/// The owner's region: the stream wraps around it (touched once before the clock starts, so
/// the measurement is of the network, not of first-touch page faults).
const REGION_BYTES_MAX: u64 = 64 << 20;
/// Most runs of one comparison.
const REPEAT_MAX: usize = 20;
/// Most MiB one run streams.
const STREAM_MIB_MAX: u64 = 4096;
/// MiB streamed over unshaped rails when not told.
const STREAM_MIB_UNSHAPED: u64 = 256;

/// MiB to stream when not told: what rails of `nominal` bytes a second carry in `secs` (the
/// time iperf3 runs), so the stream and iperf3 each pay their start-up once over about the
/// same stretch; a fixed amount over unshaped rails.
fn stream_mib(nominal: u64, secs: u64) -> u64 {
    if nominal == 0 {
        return STREAM_MIB_UNSHAPED;
    }
    (nominal.saturating_mul(secs) >> 20).clamp(1, STREAM_MIB_MAX)
}

fn region_bytes(total: u64) -> u64 {
    total.min(REGION_BYTES_MAX).div_ceil(CHUNK) * CHUNK
}

/// The tag of the `i`th of `n` writes into a region of `slots` MiB: which MiB of the region it
/// lands in, and whether it is the last write there (whose bytes the owner finds at the end).
/// Writes with different tags carry different bytes, so a write that lands in the wrong MiB,
/// or a last pass that never arrived, shows in the owner's check.
fn chunk_tag(i: u64, n: u64, slots: u64) -> u64 {
    let slot = i % slots;
    2 * slot + u64::from(i + slots >= n)
}

/// The index of the last of `n` writes that lands in MiB `slot` of a region of `slots` MiB
/// (`n` at least `slots`).
fn last_into(slot: u64, n: u64, slots: u64) -> u64 {
    n - 1 - (n - 1 - slot) % slots
}

/// The bytes of a write tagged `tag`: a seeded pseudo-random stream (splitmix64 over the tag and
/// the word's index), so two tags differ in nearly every word.
fn pattern(tag: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    for w in 0..len.div_ceil(8) as u64 {
        let mut z = (SEED ^ (tag << 40) ^ w).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The benchmark, run as root from the command line.
pub fn run(config: &std::path::Path, mib: Option<u64>, repeat: usize, json: bool, scale: f64) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("`rackwire bench stripe` builds a virtual rack: it needs root");
    }
    if mib.is_some_and(|m| !(1..=STREAM_MIB_MAX).contains(&m)) {
        bail!("--mib must be 1..={STREAM_MIB_MAX}");
    }
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    let text = std::fs::read_to_string(config).with_context(|| format!("rack config {}", config.display()))?;
    let mut cfg = RackConfig::parse(&text)?;
    let tcp_secs = ((5.0 * scale).round() as u64).clamp(1, 30);
    let nominal: u64 = cfg.rails.iter().filter_map(|r| r.rate.as_deref().and_then(rate_bytes_per_s)).sum();
    let mib = mib.unwrap_or_else(|| stream_mib(nominal, tcp_secs));
    let exe = crate::spawn::own_exe()?;
    let (state, _down) = rackwire_rack::place::two_machines_up(&mut cfg, &exe)?;
    let mut report = Report::default();
    // Per run: edge over iperf3's TCP, and edge over the nominal rate.
    let (mut vs_tcp, mut vs_nominal) = (Vec::new(), Vec::new());
    for run in 1..=repeat {
        let one = measure_once(&cfg, &state, &exe, mib, tcp_secs, nominal)?;
        let ours = one.rows.first().and_then(|r| r.mb_per_s).unwrap_or(0.0);
        if let Some(tcp) = one.rows.get(1).and_then(|r| r.mb_per_s) {
            vs_tcp.push(ours / tcp);
        }
        if nominal > 0 {
            vs_nominal.push(ours * 1e6 / nominal as f64);
        }
        for mut r in one.rows {
            if repeat > 1 {
                r.variant = Some(format!("run {run}"));
            }
            report.rows.push(r);
        }
        let tag = if repeat > 1 { format!("run {run}: ") } else { String::new() };
        report.notes.extend(one.notes.into_iter().map(|n| format!("{tag}{n}")));
    }
    let of = |v: &mut Vec<f64>| (!v.is_empty()).then(|| median_spread(v));
    if let Some((m, lo, hi)) = of(&mut vs_tcp) {
        report.notes.push(format!(
            "edge over {} rails / one iperf3 TCP stream on rail 0: {m:.2} (median of {repeat}; {lo:.2}-{hi:.2})",
            cfg.rails.len()
        ));
    }
    if let Some((m, lo, hi)) = of(&mut vs_nominal) {
        report
            .notes
            .push(format!("edge goodput / nominal rate of the rails: {m:.3} (median of {repeat}; {lo:.3}-{hi:.3})"));
    }
    report.meta.insert("repeats".into(), repeat.into());
    report.meta.insert("command".into(), std::env::args().collect::<Vec<_>>().join(" ").into());
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", print_table(&report));
    }
    Ok(())
}

/// One run over the rack that is up: the stream (checked byte-exact by the owner), then
/// iperf3 on rail 0; the rows and what the run saw on the way.
fn measure_once(
    cfg: &RackConfig,
    state: &rackwire_rack::RackState,
    exe: &std::path::Path,
    mib: u64,
    tcp_secs: u64,
    nominal: u64,
) -> Result<Report> {
    let (src, dst) = (state.hosts[0].clone(), state.hosts[1].clone());
    let link_mtu = cfg.frame_max().to_string();
    // Each side on its host's cores, if the rack gives them some.
    let spawn = |host: &rackwire_rack::HostState, role: &str, name: &str| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &host.ns])
            .arg(exe)
            .args([crate::spawn::STRIPE_WORKER, role, &(mib << 20).to_string()])
            .env(rackwire::vars::MH, &state.mh)
            .env(rackwire::vars::SECRET_FILE, &state.secret_file)
            .env(rackwire::vars::NAME, name)
            .env(rackwire::vars::LINKS, host.links())
            .env(rackwire::vars::TRANSPORT, "edge")
            .env(rackwire::vars::LINK_MTU, &link_mtu)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        rackwire_rack::cores::on_cores(&host.cores, || c.spawn()).and_then(|r| r)
    };
    let mut owner = spawn(&dst, "owner", "stripe-dst")?;
    let mut writer = spawn(&src, "writer", "stripe-src")?;
    let mut owner_out = BufReader::new(owner.stdout.take().expect("piped"));
    let mut writer_out = BufReader::new(writer.stdout.take().expect("piped"));
    let mut line = String::new();
    writer_out.read_line(&mut line)?;
    let w: serde_json::Value = serde_json::from_str(line.trim()).with_context(|| format!("writer said {line:?}"))?;
    line.clear();
    owner_out.read_line(&mut line)?;
    let checked = line.trim().to_string();
    let _ = owner.wait();
    let _ = writer.wait();
    if checked != "ok" {
        bail!("the owner's check failed: {checked}");
    }
    let secs = w["secs"].as_f64().context("writer result")?;
    let bytes = (mib << 20) as f64;
    let mut report = Report::default();
    report.rows.push(Row {
        transport: format!("udp-{}l", cfg.rails.len()),
        pattern: "oneway".into(),
        size: CHUNK,
        iters: mib,
        mb_per_s: Some(bytes / secs / 1e6),
        retransmits: w["retransmits"].as_u64(),
        extra_pct: w["extra_pct"].as_f64(),
        out_of_order_pct: w["ooo_pct"].as_f64(),
        ..Row::default()
    });
    report.notes.push(format!(
        "frames declared lost: {} ({} by timeout); window cuts: {}, undone as spurious: {}",
        w["losses"], w["timeouts"], w["cuts"], w["undone"]
    ));
    let path = NetPath {
        server_ns: Some(dst.ns.clone()),
        client_ns: Some(src.ns.clone()),
        addr: dst.addrs[0].to_string(),
        server_cores: dst.cores.clone(),
        client_cores: src.cores.clone(),
    };
    match iperf3_path(&path, 131_072, tcp_secs, "iperf3-tcp") {
        Ok(r) => report.rows.push(r),
        Err(e) => report.notes.push(format!("iperf3-tcp: {e}")),
    }
    report.notes.push(format!("{mib} MiB arrived byte-exact (checked by the owner)"));
    if nominal > 0 {
        // Where frames were lost: the shapers on the way (sender's links, switch ports).
        let mut drops = 0;
        for k in 0..cfg.rails.len() {
            drops += tc_dropped(&src.ns, &format!("eth{k}"))
                + tc_dropped(&rackwire_rack::ns_name(&cfg.name, "sw"), &format!("h1r{k}"));
        }
        report.notes.push(format!("packets the shapers dropped on the way (since the rack came up): {drops}"));
        report.notes.push(format!(
            "UDP datagrams the receiving host dropped for want of socket buffer: {}",
            udp_rcvbuf_errors(&dst.ns)
        ));
    }
    Ok(report)
}

/// Packets `tc` says the root qdisc of `dev` in `ns` dropped.
fn tc_dropped(ns: &str, dev: &str) -> u64 {
    let out = Command::new("tc").args(["-s", "-n", ns, "qdisc", "show", "dev", dev]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    text.split("dropped ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `RcvbufErrors` of the UDP counters in namespace `ns`.
fn udp_rcvbuf_errors(ns: &str) -> u64 {
    let out = Command::new("ip").args(["netns", "exec", ns, "cat", "/proc/net/snmp"]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// One side of the stream, in its host (started by [`run`]); `role` is `owner` or `writer`.
pub fn worker(role: &str, total: u64) -> Result<()> {
    if total == 0 || !total.is_multiple_of(CHUNK) || total > STREAM_MIB_MAX * CHUNK {
        bail!("a stream is 1..={STREAM_MIB_MAX} whole MiB, not {total} bytes");
    }
    let mut cfg = rackwire::FabricConfig::from_env()?;
    cfg.op_timeout = STEP_TIMEOUT;
    let deadline = Instant::now() + STEP_TIMEOUT;
    let fabric = loop {
        match Fabric::join(cfg.clone()) {
            Ok(f) => break f,
            Err(e) if Instant::now() > deadline => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let mut out = std::io::stdout();
    match role {
        "owner" => {
            let len = region_bytes(total);
            let region = fabric.alloc(len, Access::ALL)?;
            region.write_at(0, &vec![0u8; len as usize])?;
            let src = loop {
                if let Some(n) = fabric.nodes()?.into_iter().find(|n| n.info.name == "stripe-src" && n.up) {
                    break n.info.id;
                }
                if Instant::now() > deadline {
                    bail!("the writer never joined");
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            region.grant(src, Access::WRITE)?;
            region.publish(REGION_NAME)?;
            fabric.wait_notification(STEP_TIMEOUT)?;
            // Every MiB of the region holds the bytes of the last write into it.
            let slots = len / CHUNK;
            let n = total / CHUNK;
            let mut verdict = "ok".to_string();
            for slot in 0..slots {
                let got = region.to_vec(slot * CHUNK, CHUNK as usize)?;
                if got != pattern(chunk_tag(last_into(slot, n, slots), n, slots), CHUNK as usize) {
                    verdict = format!("bytes differ in MiB {slot} of the region");
                    break;
                }
            }
            writeln!(out, "{verdict}")?;
        }
        "writer" => {
            let target = loop {
                match fabric.lookup(REGION_NAME) {
                    Ok(t) => break t,
                    Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                    Err(e) => return Err(e.into()),
                }
            };
            let conn = fabric.connect(target.node())?;
            // The region is a whole number of writes, so no write wraps. The writes' bytes come
            // from a pool of one buffer per tag (at most two per MiB of the region), shared by
            // the writes that carry them, as a streaming program reuses its buffers.
            let (n, slots) = (total / CHUNK, target.len() / CHUNK);
            if slots == 0 || !target.len().is_multiple_of(CHUNK) || n < slots {
                bail!("the owner's region ({} bytes) does not fit a stream of {n} MiB", target.len());
            }
            let pool: Vec<Bytes> = (0..2 * slots)
                .map(|tag| {
                    if (tag & 1 == 0) && n == slots {
                        Bytes::new()
                    } else {
                        Bytes::from(pattern(tag, CHUNK as usize))
                    }
                })
                .collect();
            let t0 = Instant::now();
            let mut flight = std::collections::VecDeque::new();
            for i in 0..n {
                if flight.len() == IN_FLIGHT {
                    let op: rackwire::Op = flight.pop_front().expect("full");
                    op.wait()?;
                }
                let last = i + 1 == n;
                let c = pool[chunk_tag(i, n, slots) as usize].clone();
                let flags = if last { OpFlags::NONE.notify(1).fence_before() } else { OpFlags::NONE };
                let at = (i % slots) * CHUNK;
                flight.push_back(conn.write_bytes(&target, at, c, flags));
            }
            for op in flight {
                op.wait()?;
            }
            let secs = t0.elapsed().as_secs_f64();
            let s = conn.stats().edge_or_zero();
            writeln!(
                out,
                "{}",
                serde_json::json!({
                    "secs": secs,
                    "retransmits": s.retransmits,
                    "extra_pct": 100.0 * s.retransmits as f64 / s.data_frames.max(1) as f64,
                    "ooo_pct": 100.0 * s.out_of_order as f64 / s.frames_received.max(1) as f64,
                    "losses": s.losses,
                    "timeouts": s.loss_timeouts,
                    "cuts": s.window_cuts,
                    "undone": s.cuts_undone,
                })
            )?;
        }
        other => bail!("unknown role {other:?}"),
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the writes' tags on a region of 4 MiB: the i-th write's MiB is i mod 4, only the
    // last write into each MiB is marked last (including when the stream is one pass) and is
    // the one the owner checks, and the pattern gives each tag its own bytes (fewer than 4 of
    // 512 words alike between any two tags).
    #[test]
    fn each_region_mib_ends_with_its_last_write() {
        let mib = CHUNK;
        let tags: Vec<u64> = (0..10).map(|i| chunk_tag(i, 10, 4)).collect();
        assert_eq!(tags, [0, 2, 4, 6, 0, 2, 5, 7, 1, 3]);
        assert_eq!((0..4).map(|i| chunk_tag(i, 4, 4)).collect::<Vec<_>>(), [1, 3, 5, 7]);
        assert_eq!((0..4).map(|s| last_into(s, 10, 4)).collect::<Vec<_>>(), [8, 9, 6, 7]);
        assert_eq!((0..4).map(|s| chunk_tag(last_into(s, 10, 4), 10, 4)).collect::<Vec<_>>(), [1, 3, 5, 7]);
        let bytes: Vec<Vec<u8>> = (0..8).map(|t| pattern(t, 4096)).collect();
        for (a, x) in bytes.iter().enumerate() {
            for y in &bytes[a + 1..] {
                assert!(x.chunks(8).zip(y.chunks(8)).filter(|(p, q)| p == q).count() < 4);
            }
        }
        assert_eq!(pattern(3, 13), pattern(3, 16)[..13]);
        assert_eq!(region_bytes(3 * mib), 3 * mib);
        assert_eq!(region_bytes(1000 * mib), REGION_BYTES_MAX);
        // Streams last about as long as iperf3 runs on shaped rails: 1 Gbit/s for 3 s is
        // 357 MiB; 10 Gbit/s for 30 s is more than one run streams; unshaped, the fixed amount.
        assert_eq!(stream_mib(125_000_000, 3), 357);
        assert_eq!(stream_mib(1_250_000_000, 30), STREAM_MIB_MAX);
        assert_eq!(stream_mib(0, 3), STREAM_MIB_UNSHAPED);
    }
}
