//! `rackwire sim`: the edge transport in the deterministic simulator.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use rackwire_sim::{run_driven, run_seed, SeedReport, SimFailure};

/// The most seeds one swarm run takes.
const SEEDS_MAX: u64 = 10_000_000;

#[derive(Args)]
pub(crate) struct SimArgs {
    /// Run this many seeds (a swarm), starting at --from.
    #[arg(long, conflicts_with = "seed")]
    seeds: Option<u64>,
    /// First seed of a swarm.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Run one seed.
    #[arg(long)]
    seed: Option<u64>,
    /// With --seed: print the connection and link counters.
    #[arg(long)]
    stats: bool,
    /// Run the edge driver's world instead: two nodes whose application and network threads
    /// hand the endpoint over as the edge transport does, checked against the hand-off's
    /// bounds.
    #[arg(long)]
    driven: bool,
}

pub(crate) fn run(a: &SimArgs) -> Result<()> {
    match (a.seed, a.seeds) {
        (Some(s), _) if a.driven => one_driven(s),
        (Some(s), _) => one(s, a.stats),
        (None, Some(n)) => swarm(a.from, n, a.driven),
        (None, None) => bail!("give --seeds N (a swarm) or --seed S (one run)"),
    }
}

fn one(seed: u64, stats: bool) -> Result<()> {
    let t = Instant::now();
    match run_seed(seed) {
        Ok(r) => {
            println!(
                "seed {seed} passed: {} nodes, {} links each, {} operations, {} bytes written, {:.1} ms simulated, {:.0} ms real",
                r.nodes,
                r.links,
                r.ops,
                r.bytes,
                r.sim_us as f64 / 1e3,
                t.elapsed().as_secs_f64() * 1e3
            );
            println!("faults: {}", r.faults);
            if stats {
                print_stats(&r);
            }
            Ok(())
        }
        Err(e) => bail!("{e}"),
    }
}

fn one_driven(seed: u64) -> Result<()> {
    let t = Instant::now();
    let r = run_driven(seed).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "seed {seed} passed: {} ping-pongs, {} operations, {:.1} ms simulated, {:.0} ms real",
        r.pings,
        r.ops,
        r.sim_us as f64 / 1e3,
        t.elapsed().as_secs_f64() * 1e3
    );
    println!(
        "rounds: {} by application threads, {} by network threads; {} rests, {} gathers; longest wait to be read {} µs ({} µs while resting)",
        r.app_rounds, r.net_rounds, r.rests, r.gathers, r.read_max, r.rested_read_max
    );
    Ok(())
}

fn print_stats(r: &SeedReport) {
    let mut t = rackwire_bench::table();
    t.set_header([
        "conn",
        "frames sent",
        "frames recv",
        "data",
        "retransmits",
        "extra %",
        "out of order %",
        "duplicates",
        "acks",
        "nacks",
        "refused",
        "malformed",
        "ops chained",
    ]);
    for (a, b, s) in &r.conns {
        t.add_row([
            format!("{a}->{b}"),
            s.frames_sent.to_string(),
            s.frames_received.to_string(),
            s.data_frames.to_string(),
            s.retransmits.to_string(),
            format!("{:.2}", 100.0 * s.extra_share()),
            format!("{:.2}", 100.0 * s.out_of_order_share()),
            s.duplicates.to_string(),
            s.acks_sent.to_string(),
            s.nacks_sent.to_string(),
            s.refused.to_string(),
            s.malformed.to_string(),
            s.ops_chained.to_string(),
        ]);
    }
    println!("{t}");
    let mut t = rackwire_bench::table();
    t.set_header([
        "conn",
        "link",
        "frames sent",
        "bytes sent",
        "frames recv",
        "retransmits",
        "losses",
        "probes",
        "downs",
        "srtt µs",
        "min rtt µs",
        "window",
    ]);
    for (a, b, s) in &r.conns {
        for (l, k) in s.links.iter().enumerate() {
            t.add_row([
                format!("{a}->{b}"),
                l.to_string(),
                k.frames_sent.to_string(),
                k.bytes_sent.to_string(),
                k.frames_received.to_string(),
                k.retransmits.to_string(),
                k.losses.to_string(),
                k.probes.to_string(),
                k.downs.to_string(),
                k.srtt_us.to_string(),
                k.min_rtt_us.to_string(),
                k.window.to_string(),
            ]);
        }
    }
    println!("{t}");
    let mut t = rackwire_bench::table();
    t.set_header(["wire", "offered", "lost", "black-holed", "queue drops", "duplicated", "corrupted"]);
    for (a, b, l, w) in &r.wires {
        t.add_row([
            format!("{a}->{b} link {l}"),
            w.offered.to_string(),
            w.lost.to_string(),
            w.blackholed.to_string(),
            w.overflow.to_string(),
            w.duplicated.to_string(),
            w.corrupted.to_string(),
        ]);
    }
    println!("{t}");
}

fn swarm(from: u64, n: u64, driven: bool) -> Result<()> {
    if n == 0 || n > SEEDS_MAX {
        bail!("--seeds must be 1..={SEEDS_MAX}");
    }
    let Some(end) = from.checked_add(n) else { bail!("--from + --seeds overflows") };
    let t = Instant::now();
    let next = AtomicU64::new(from);
    let failures: Mutex<Vec<SimFailure>> = Mutex::new(Vec::new());
    let bar = ProgressBar::new(n);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} seeds {msg}")
            .expect("valid template"),
    );
    let threads = std::thread::available_parallelism().map(|p| p.get()).unwrap_or(1).clamp(1, 16);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                let r = if driven { run_driven(seed).map(|_| ()) } else { run_seed(seed).map(|_| ()) };
                if let Err(e) = r {
                    bar.println(format!("{e}\n  reproduce: {}", reproduce(e.seed, driven)));
                    failures.lock().unwrap_or_else(|e| e.into_inner()).push(e);
                    bar.set_message("(failures)");
                }
                bar.inc(1);
            });
        }
    });
    bar.finish_and_clear();
    let mut failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort_by_key(|f| f.seed);
    let secs = t.elapsed().as_secs_f64();
    if failures.is_empty() {
        println!("{n} seeds ({from}..{end}) passed in {secs:.1} s");
        Ok(())
    } else {
        for f in &failures {
            eprintln!("{f}\n  reproduce: {}", reproduce(f.seed, driven));
        }
        bail!("{} of {n} seeds failed ({secs:.1} s)", failures.len())
    }
}

/// The command that runs one failing seed again.
fn reproduce(seed: u64, driven: bool) -> String {
    if driven {
        format!("rackwire sim --driven --seed {seed}")
    } else {
        format!("rackwire sim --seed {seed} --stats")
    }
}
