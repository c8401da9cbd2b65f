//! `rackwire bench coll`: collective latency by the OSU method, rackwire's ranks beside Open
//! MPI's in the same run.
//!
//! The method (the OSU micro-benchmarks'): per size, warm-up calls, then timed calls each
//! preceded by a barrier; each rank averages its own time per call; the row gives the average
//! over the ranks, and the fastest and slowest rank's average. With `--repeat R` the whole
//! comparison runs R times, ours and the peer's alternating, and a row gives the median of the
//! R averages with their spread.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rackwire_coll::{Group, ReduceOp};

use crate::mpi_rack::MpiRack;

/// Collectives the benchmark knows.
pub const OPS: [&str; 5] = ["barrier", "bcast", "scatter", "alltoallv", "allreduce"];
/// Sizes when none are given.
pub const SIZES_DEFAULT: &str = "8,64,1K,8K,64K,1M";
/// Repeats at most.
const REPEAT_MAX: usize = 50;

/// Timed and warm-up calls for one size, as the OSU benchmarks choose them (1000 and 100 up
/// to 8 KiB, 100 and 10 above), times `scale`.
fn iterations(size: u64, scale: f64) -> (usize, usize) {
    let (iters, warmup) = if size <= 8192 { (1000.0, 100.0) } else { (100.0, 10.0) };
    (((iters * scale) as usize).max(5), ((warmup * scale) as usize).max(1))
}

/// A warm-up lasts at least this long, on both sides. A fresh job's first calls run slow for
/// reasons outside either program: on this machine the first few hundred 1 MiB alltoallv
/// calls took up to three times as long as later ones, in a bare C program too, while a pure
/// compute loop ran at full speed at once. With the OSU counts at `--scale 0.3` a 1 MiB
/// warm-up would be three calls. Both harnesses add calls until this much time has passed.
/// 50 ms was not enough for a fresh job's 1 MiB alltoallv between two ranks (side by side, two
/// runs of five: 158 and 176 µs, against 118 and 119 after 250 ms; Open MPI's 161 and 157
/// against 153 and 151).
pub const WARMUP_MIN: Duration = Duration::from_millis(250);
/// Calls a warm-up gains from [`WARMUP_MIN`] at most.
const WARMUP_EXTRA_MAX: usize = 100_000;

/// Times one Open MPI measurement is tried before the benchmark fails.
const PEER_ATTEMPTS: u32 = 2;

/// One measured row.
#[derive(Clone, Debug)]
struct Measured {
    op: String,
    size: u64,
    iters: usize,
    avg: f64,
    min: f64,
    max: f64,
}

fn parse_row(line: &str) -> Option<Measured> {
    let mut f = line.strip_prefix("ROW ")?.split_whitespace();
    Some(Measured {
        op: f.next()?.to_string(),
        size: f.next()?.parse().ok()?,
        iters: f.next()?.parse().ok()?,
        avg: f.next()?.parse().ok()?,
        min: f.next()?.parse().ok()?,
        max: f.next()?.parse().ok()?,
    })
}

/// A rank of the benchmark job (`rackwire coll-worker`): every op at every size; rank 0
/// prints one `ROW` line per measurement.
pub fn worker(ops: &[String], sizes: &[u64], scale: f64) -> Result<()> {
    let mut g = Group::from_env()?;
    let (me, n) = (g.rank(), g.size());
    // alltoallv is measured twice: into a plain buffer (staged through the receiver's
    // window), and into registered memory, a symmetric region (large blocks written by their
    // sender straight into place: the one-sided way, as UCC and OpenSHMEM do it).
    let ops = ops.iter().flat_map(|op| {
        let also = (op == "alltoallv").then(|| "alltoallv/registered".to_string());
        std::iter::once(op.clone()).chain(also)
    });
    for op in ops {
        let sizes: &[u64] = if op == "barrier" { &[0] } else { sizes };
        for &size in sizes {
            let s = size as usize;
            let (iters, warmup) = iterations(size, scale);
            let send = vec![1u8; s * n];
            let recv = vec![0u8; s * n];
            let dest = if op.ends_with("/registered") {
                Some(g.alloc_symmetric((s * n) as u64, rackwire::Access::READ | rackwire::Access::WRITE)?)
            } else {
                None
            };
            let mut b = Bufs { send, recv, dest, counts: vec![s; n], floats: vec![1.0f32; (s / 4).max(1)] };
            let t = Instant::now();
            let mut warm = |g: &mut Group, calls: usize| -> Result<()> {
                for _ in 0..calls {
                    g.barrier()?;
                    call(g, &op, me, s, &mut b)?;
                }
                Ok(())
            };
            warm(&mut g, warmup)?;
            // More warm-up calls until `WARMUP_MIN` has passed, as many on every rank: the
            // slowest rank's time per call decides (the same rule as the Open MPI harness).
            let mut spent = [t.elapsed().as_secs_f64()];
            g.allreduce(&mut spent, ReduceOp::Max)?;
            warm(&mut g, extra_warmup(spent[0], warmup))?;
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                g.barrier()?;
                let t0 = Instant::now();
                call(&mut g, &op, me, s, &mut b)?;
                total += t0.elapsed();
            }
            let mine = total.as_secs_f64() * 1e6 / iters as f64;
            let mut all = vec![0f64; n];
            g.allgather(&mine.to_ne_bytes(), bytemuck::cast_slice_mut(&mut all))?;
            if me == 0 {
                let avg = all.iter().sum::<f64>() / n as f64;
                let min = all.iter().copied().fold(f64::INFINITY, f64::min);
                let max = all.iter().copied().fold(0.0, f64::max);
                println!("ROW {op} {size} {iters} {avg:.3} {min:.3} {max:.3}");
            }
        }
    }
    g.leave()?;
    Ok(())
}

/// A measurement's buffers.
struct Bufs {
    send: Vec<u8>,
    recv: Vec<u8>,
    /// The symmetric region `alltoallv/registered` writes into.
    dest: Option<rackwire_coll::SymmetricRegion>,
    counts: Vec<usize>,
    floats: Vec<f32>,
}

/// One call of collective `op` with blocks of `s` bytes.
fn call(g: &mut Group, op: &str, me: usize, s: usize, b: &mut Bufs) -> Result<()> {
    match op {
        "barrier" => g.barrier()?,
        "bcast" => g.bcast(0, &mut b.recv[..s])?,
        "scatter" => g.scatter(0, if me == 0 { &b.send } else { &[] }, &mut b.recv[..s])?,
        "alltoallv" => g.alltoallv(&b.send, &b.counts, &mut b.recv, &b.counts)?,
        "alltoallv/registered" => {
            let dest = b.dest.as_ref().expect("allocated for this op");
            g.alltoallv_to(&b.send, &b.counts, dest, 0, &b.counts)?
        }
        "allreduce" => g.allreduce(&mut b.floats, ReduceOp::Sum)?,
        other => bail!("unknown collective {other:?}"),
    }
    Ok(())
}

/// Calls to add to a warm-up of `calls` calls that took `spent` seconds (on the slowest
/// rank) so that it lasts [`WARMUP_MIN`] in all, at most [`WARMUP_EXTRA_MAX`].
fn extra_warmup(spent: f64, calls: usize) -> usize {
    let left = WARMUP_MIN.as_secs_f64() - spent;
    if left <= 0.0 {
        return 0;
    }
    let per_call = spent / calls.max(1) as f64;
    if per_call <= 0.0 {
        return WARMUP_EXTRA_MAX;
    }
    // Rounded up, but not past a whole number that floating point missed by a hair.
    ((left / per_call - 1e-9).ceil() as usize).min(WARMUP_EXTRA_MAX)
}

/// Run our ranks once: every op and size at `ranks` ranks.
fn run_ours(
    ranks: usize,
    ops: &[String],
    sizes: &[u64],
    scale: f64,
    edge: bool,
    rack: Option<&str>,
) -> Result<Vec<Measured>> {
    let mut cmd = crate::spawn::job(ranks, rack.map(Path::new), crate::spawn::COLL_WORKER)?;
    cmd.args(["--op", &ops.join(","), "--size"])
        .arg(sizes.iter().map(u64::to_string).collect::<Vec<_>>().join(","))
        .args(["--scale", &scale.to_string()]);
    if edge {
        cmd.env(rackwire::vars::TRANSPORT, "edge").env(rackwire::vars::LINKS, "127.0.0.1:0");
    }
    let o = cmd.output().context("running the benchmark job")?;
    if !o.status.success() {
        bail!(
            "the benchmark job failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).lines().filter_map(parse_row).collect())
}

/// Build the Open MPI harness with mpicc in `dir`.
fn build_peer(dir: &Path) -> Result<PathBuf> {
    build_mpi(dir, "coll_peer", include_str!("programs/coll_peer.c"))
}

/// Build the MPI program `source` with mpicc in `dir`, as `dir/name`.
pub fn build_mpi(dir: &Path, name: &str, source: &str) -> Result<PathBuf> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source)?;
    let exe = dir.join(name);
    let o = Command::new("mpicc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .context("mpicc not found: install Debian's openmpi-bin and libopenmpi-dev")?;
    if !o.status.success() {
        bail!("mpicc failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(exe)
}

/// Run Open MPI's ranks once for every op and size, as its users run it: `mpirun -n N` with
/// its default transports on this machine, or TCP over a rack's rails (see [`MpiRack`]) (as
/// root it needs --allow-run-as-root; with more ranks than cores, --oversubscribe, which also
/// makes idle ranks yield their core).
fn run_peer(
    exe: &Path,
    ranks: usize,
    ops: &[String],
    sizes: &[u64],
    scale: f64,
    rack: Option<&MpiRack>,
) -> Result<Vec<Measured>> {
    let mut rows = Vec::new();
    for op in ops {
        let sizes: &[u64] = if op == "barrier" { &[0] } else { sizes };
        for &size in sizes {
            let (iters, warmup) = iterations(size, scale);
            // Open MPI's daemons now and then fail to start over a rack (a daemon that dies
            // while setting up): one more try before the benchmark gives up.
            let mut attempt = 0;
            let o = loop {
                attempt += 1;
                let mut cmd = rack.map_or_else(|| Command::new("mpirun"), |r| r.mpirun_tcp(ranks));
                let o = cmd
                    .args(["--allow-run-as-root", "--oversubscribe", "-n", &ranks.to_string()])
                    .arg(exe)
                    .args([op.as_str(), &size.to_string(), &iters.to_string(), &warmup.to_string()])
                    .arg(WARMUP_MIN.as_millis().to_string())
                    .output()
                    .context("mpirun not found: install Debian's openmpi-bin")?;
                if o.status.success() {
                    break o;
                }
                let err = String::from_utf8_lossy(&o.stderr).into_owned();
                if attempt >= PEER_ATTEMPTS {
                    bail!("mpirun failed {attempt} times; the last:\n{err}");
                }
                eprintln!("mpirun failed ({op} {size}); trying again. It said:\n{err}");
            };
            rows.extend(String::from_utf8_lossy(&o.stdout).lines().filter_map(parse_row));
        }
    }
    Ok(rows)
}

/// What `rackwire bench coll` was asked.
pub struct CollBench {
    /// Job sizes to run, one run each.
    pub ranks: Vec<usize>,
    /// The collectives to time.
    pub ops: Vec<String>,
    /// Message sizes in bytes.
    pub sizes: Vec<u64>,
    /// Open MPI's collectives beside ours, in the same run.
    pub peers: bool,
    /// Our ranks over the edge transport (else shared memory).
    pub edge: bool,
    /// Run the ranks over this virtual rack's hosts.
    pub rack: Option<PathBuf>,
    /// Iteration budget scale (1.0 full).
    pub scale: f64,
    /// Runs of the whole comparison.
    pub repeat: usize,
    /// One JSON document instead of a table.
    pub json: bool,
}

/// Run `rackwire bench coll` and print its rows.
pub fn run(b: &CollBench) -> Result<()> {
    let rows = measure(b)?;
    if b.json {
        let doc = serde_json::json!({
            "meta": { "command": std::env::args().collect::<Vec<_>>().join(" "), "method": "osu" },
            "rows": rows,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    print_rows(&rows);
    Ok(())
}

/// Measure every row `b` asks for (ours and, with peers, Open MPI's).
pub fn measure(b: &CollBench) -> Result<Vec<serde_json::Value>> {
    for op in &b.ops {
        if !OPS.contains(&op.as_str()) {
            bail!("unknown collective {op:?}: use {}", OPS.join(", "));
        }
    }
    if b.ranks.iter().any(|&r| !(1..=rackwire_coll::RANKS_MAX).contains(&r)) {
        bail!("--ranks must be 1..={}", rackwire_coll::RANKS_MAX);
    }
    if !(1..=REPEAT_MAX).contains(&b.repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    let dir = std::env::temp_dir().join(format!("rackwire-coll-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let peer = if b.peers { Some(build_peer(&dir)) } else { None };
    let peer = match peer {
        Some(Ok(p)) => Some(p),
        Some(Err(e)) => {
            eprintln!("peer rows skipped: {e:#}");
            None
        }
        None => None,
    };
    let (rack, _down) = match &b.rack {
        Some(r) => {
            // Without the virtual NIC: Open MPI's TCP between the hosts must take the rails
            // themselves (with rw0 up, every host address is routed through it, and Open MPI
            // would ride our own transport). Our ranks use the edge transport directly.
            let (state, down) = crate::spawn::rack_up(r, true)?;
            if let Some(h) = state.config.hosts.iter().find(|h| h.vnic && !h.remote) {
                bail!(
                    "rack {}: host {} runs rw0, so Open MPI's TCP would ride it; give a rack description (brought up without rw0) or take the rack down",
                    state.config.name,
                    h.name
                );
            }
            (Some(state), down)
        }
        None => (None, None),
    };
    let peer_rack = rack.as_ref().map(|s| MpiRack::new(s, &dir, false)).transpose()?;
    // Over a rack, ours is the edge transport where hosts are in different memory domains.
    let domains: std::collections::BTreeSet<&str> =
        rack.iter().flat_map(|s| rackwire_rack::place::rank_hosts(s)).map(|h| h.domain.as_str()).collect();
    let ours = if b.edge || domains.len() > 1 { "udp" } else { "shm" };
    let peer_name = if rack.is_some() { "openmpi-tcp" } else { "openmpi" };
    let rack_name = rack.as_ref().map(|s| s.config.name.clone());
    // (transport, op, destination, size, ranks) -> each repeat's measurement, in repeat order.
    let mut got: BTreeMap<(String, String, String, u64, usize), Vec<Measured>> = BTreeMap::new();
    for rep in 0..b.repeat {
        for &n in &b.ranks {
            // One op and size at a time, ours and the peer's one right after the other, so a
            // change in how busy this machine is falls on both of a pair; who goes first
            // alternates, so neither always runs on a warmer (or busier) machine.
            for (k, (op, size)) in op_sizes(&b.ops, &b.sizes).enumerate() {
                let order: &[bool] = if (rep + k) % 2 == 0 { &[true, false] } else { &[false, true] };
                for &mine in order {
                    let (ops, sizes) = (std::slice::from_ref(op), std::slice::from_ref(&size));
                    let rows = if mine {
                        run_ours(n, ops, sizes, b.scale, b.edge, rack_name.as_deref())?
                    } else if let Some(exe) = &peer {
                        run_peer(exe, n, ops, sizes, b.scale, peer_rack.as_ref())?
                    } else {
                        continue;
                    };
                    let t = if mine { ours } else { peer_name };
                    for r in rows {
                        let (pattern, dest) = r.op.split_once('/').unwrap_or((&r.op, "buffer"));
                        let key = (t.to_string(), pattern.to_string(), dest.to_string(), r.size, n);
                        got.entry(key).or_default().push(r);
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let mut rows = Vec::new();
    for ((transport, op, dest, size, ranks), ms) in &got {
        let mut avgs: Vec<f64> = ms.iter().map(|m| m.avg).collect();
        let (avg, lo, hi) = crate::repeat::median_spread(&mut avgs);
        let best = ms.iter().min_by(|a, b| (a.avg - avg).abs().total_cmp(&(b.avg - avg).abs())).expect("one");
        let mut row = serde_json::json!({
            "transport": transport, "pattern": op, "dest": dest, "size": size, "ranks": ranks, "iters": best.iters,
            "lat_us_avg": avg, "lat_us_min": best.min, "lat_us_max": best.max,
            "repeats": ms.len(), "lat_us_avg_lo": lo, "lat_us_avg_hi": hi,
        });
        // Against the peer: each repeat's ratio (ours over the peer's measured beside it).
        if !transport.starts_with("openmpi") {
            let peer_key = (peer_name.to_string(), op.clone(), "buffer".to_string(), *size, *ranks);
            if let Some(theirs) = got.get(&peer_key) {
                let mut r: Vec<f64> = ms.iter().zip(theirs).map(|(a, b)| a.avg / b.avg).collect();
                if !r.is_empty() {
                    let (ratio, lo, hi) = crate::repeat::median_spread(&mut r);
                    row["vs_peer"] = serde_json::json!({ "ratio": ratio, "ratio_lo": lo, "ratio_hi": hi });
                }
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Every (op, size) a run measures, in order: the barrier once, with the first size (both
/// harnesses ignore it and report the barrier at size 0).
fn op_sizes<'a>(ops: &'a [String], sizes: &'a [u64]) -> impl Iterator<Item = (&'a String, u64)> + 'a {
    ops.iter().flat_map(move |op| {
        let sizes = if op == "barrier" { &sizes[..sizes.len().min(1)] } else { sizes };
        sizes.iter().map(move |&s| (op, s))
    })
}

/// The rows as a table, with each of ours against Open MPI's.
pub fn print_rows(rows: &[serde_json::Value]) {
    let mut t = crate::table();
    t.set_header([
        "collective",
        "dest",
        "ranks",
        "size",
        "transport",
        "avg µs",
        "min µs",
        "max µs",
        "spread of avg",
        "vs openmpi",
    ]);
    for r in rows {
        let key = |k: &str| r[k].as_f64().unwrap_or(0.0);
        let vs = &r["vs_peer"];
        let f = |k: &str| vs[k].as_f64().unwrap_or(f64::NAN);
        let ratio = match (vs.is_object(), r["repeats"].as_u64().unwrap_or(1)) {
            (false, _) => String::new(),
            (true, 1) => format!("{:.2}x", f("ratio")),
            (true, _) => format!("{:.2}x ({:.2}–{:.2})", f("ratio"), f("ratio_lo"), f("ratio_hi")),
        };
        t.add_row([
            r["pattern"].as_str().unwrap_or("").to_string(),
            r["dest"].as_str().unwrap_or("").to_string(),
            r["ranks"].to_string(),
            crate::show_size(r["size"].as_u64().unwrap_or(0)),
            r["transport"].as_str().unwrap_or("").to_string(),
            format!("{:.2}", key("lat_us_avg")),
            format!("{:.2}", key("lat_us_min")),
            format!("{:.2}", key("lat_us_max")),
            format!("{:.2}–{:.2}", key("lat_us_avg_lo"), key("lat_us_avg_hi")),
            ratio,
        ]);
    }
    println!("{t}");
    println!(
        "(vs openmpi: our average latency over Open MPI's measured right beside it, same ranks and size; \
         with --repeat the median of the repeats, smallest–largest; below 1 is faster)"
    );
    println!("(dest: the receive buffer is plain memory, or registered: a symmetric region written in place)");
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the warm-up rule on made-up timings: a warm-up already past WARMUP_MIN gains
    // nothing; a short one gains the calls that fill the rest at its own pace (rounded up);
    // a warm-up too fast to time gains the most, never more.
    #[test]
    fn extra_calls_fill_the_minimum() {
        let min = WARMUP_MIN.as_secs_f64();
        assert_eq!(extra_warmup(min, 10), 0);
        assert_eq!(extra_warmup(2.0 * min, 10), 0);
        // Ten calls took a tenth of the minimum: ninety more fill it.
        assert_eq!(extra_warmup(min / 10.0, 10), 90);
        // Three calls took a fiftieth of the minimum: 49/50 of it is left at a 150th a call.
        assert_eq!(extra_warmup(min / 50.0, 3), 147);
        assert_eq!(extra_warmup(0.0, 5), WARMUP_EXTRA_MAX);
        assert_eq!(extra_warmup(1e-12, 1), WARMUP_EXTRA_MAX);
    }
}
