//! `rackwire demo`: a management host and several node processes on this machine, a tour of
//! what they can do, the benchmarks, and a report folder.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use rackwire::{Access, Error, Fabric, FabricConfig, ManagementHost, OpFlags};
use rackwire_bench::{markdown, print_table, Pattern, Report, ShmBench};

/// How long the demo waits for a worker step.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
/// Worker processes at most.
const DEMO_WORKERS_MAX: usize = 3;
/// Bytes of each worker's slot on the board region.
const SLOT_BYTES: u64 = 64;

#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Worker node processes besides this one (1 to 3).
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Fetch-and-adds each worker does on the shared counter.
    #[arg(long, default_value_t = 10_000)]
    adds: u64,
    /// Folder for the report (created; its files are replaced).
    #[arg(long, default_value = "rackwire-report")]
    report: PathBuf,
    /// Shorter, noisier benchmarks.
    #[arg(long)]
    quick: bool,
    /// Skip the peer (UCX) rows even where ucx_perftest is installed.
    #[arg(long)]
    no_peers: bool,
}

fn env(k: &str) -> Result<String> {
    std::env::var(k).with_context(|| format!("{k} not set (demo workers are started by `rackwire demo`)"))
}

/// A worker: joins, adds to the shared counter, signs the board, shows that a revoked grant
/// is refused, and leaves when told.
pub(crate) fn worker() -> Result<()> {
    let mut cfg = FabricConfig::new(env(rackwire::vars::MH)?, env(rackwire::vars::SECRET)?, env(rackwire::vars::NAME)?);
    cfg.op_timeout = STEP_TIMEOUT;
    let coordinator: u32 = env("RW_DEMO_COORD")?.parse()?;
    let slot: u64 = env("RW_DEMO_SLOT")?.parse()?;
    let adds: u64 = env("RW_DEMO_ADDS")?.parse()?;
    let fabric = Fabric::join(cfg)?;
    let conn = fabric.connect(coordinator)?;
    conn.send(b"hello").wait()?;
    let go = conn.recv_timeout(STEP_TIMEOUT)?;
    if go != b"go" {
        bail!("expected go, got {:?}", String::from_utf8_lossy(&go));
    }
    let counter = fabric.lookup("demo/counter")?;
    let board = fabric.lookup("demo/board")?;
    let t0 = Instant::now();
    for _ in 0..adds {
        conn.fetch_add(&counter, 0, 1, OpFlags::NONE).wait()?;
    }
    let per_add_ns = t0.elapsed().as_nanos() as u64 / adds.max(1);
    let sign = format!("{} (node {}) was here", fabric.name(), fabric.id());
    conn.write(&board, slot * SLOT_BYTES, sign.as_bytes(), OpFlags::NONE.notify(slot)).wait()?;
    conn.send(format!("done {per_add_ns}").as_bytes()).wait()?;
    loop {
        let m = conn.recv_timeout(Duration::from_secs(300))?;
        match m.as_slice() {
            b"try-write" => {
                let r = conn.write(&board, slot * SLOT_BYTES, b"after revoke", OpFlags::NONE).wait();
                let answer = match r {
                    Ok(_) => "write succeeded".to_string(),
                    Err(e @ Error::Revoked { .. }) => format!("refused: {e}"),
                    Err(e) => format!("failed otherwise: {e}"),
                };
                conn.send(answer.as_bytes()).wait()?;
            }
            b"quit" => return Ok(()),
            other => bail!("unexpected {:?}", String::from_utf8_lossy(other)),
        }
    }
}

struct Workers(Vec<Child>);

impl Drop for Workers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn recv_text(f: &Fabric) -> Result<(u32, String)> {
    let m = f.recv_timeout(STEP_TIMEOUT).context("waiting for a worker")?;
    Ok((m.from, String::from_utf8_lossy(&m.data).into_owned()))
}

/// The tour: atomics across processes, one-sided writes with notifications, revocation.
fn tour(args: &DemoArgs, out: &mut String) -> Result<()> {
    let secret = format!("{:032x}", rackwire_mh::auth::random_u128());
    let state = args.report.join("mh-state");
    let _ = std::fs::remove_dir_all(&state);
    let mh = ManagementHost::start("127.0.0.1:0", Some(&state), secret.as_bytes())?;
    let addr = mh.addr().to_string();
    println!("management host on {addr}, state in {}", state.display());
    let mut cfg = FabricConfig::new(&addr, &secret, "demo-coordinator");
    cfg.op_timeout = STEP_TIMEOUT;
    let fabric = Fabric::join(cfg)?;
    let counter = fabric.alloc(4096, Access::ALL)?;
    counter.publish("demo/counter")?;
    let board = fabric.alloc(SLOT_BYTES * DEMO_WORKERS_MAX as u64, Access::READ | Access::WRITE)?;
    board.publish("demo/board")?;
    let mut workers = Workers(Vec::new());
    for i in 0..args.workers {
        let mut worker = rackwire_bench::spawn::worker(rackwire_bench::spawn::DEMO_WORKER)?;
        let child = rackwire_bench::spawn::on_fabric(&mut worker, &addr, &secret, Some(&format!("demo-worker-{i}")))
            .env("RW_DEMO_COORD", fabric.id().to_string())
            .env("RW_DEMO_SLOT", i.to_string())
            .env("RW_DEMO_ADDS", args.adds.to_string())
            .stdin(Stdio::null())
            .spawn()
            .context("starting a worker")?;
        workers.0.push(child);
    }
    let mut ids = Vec::new();
    for _ in 0..args.workers {
        let (from, text) = recv_text(&fabric)?;
        if text != "hello" {
            bail!("unexpected {text:?} from node {from}");
        }
        counter.grant(from, Access::ATOMIC)?;
        board.grant(from, Access::WRITE)?;
        ids.push(from);
    }
    println!("{} worker processes joined: nodes {ids:?}", ids.len());
    let t0 = Instant::now();
    for &id in &ids {
        fabric.connect(id)?.send(b"go").wait()?;
    }
    let mut per_add = Vec::new();
    for _ in 0..args.workers {
        let (from, text) = recv_text(&fabric)?;
        let ns: u64 = text
            .strip_prefix("done ")
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("unexpected {text:?} from {from}"))?;
        per_add.push(ns);
    }
    let elapsed = t0.elapsed();
    let mut notified = Vec::new();
    for _ in 0..args.workers {
        notified.push(fabric.wait_notification(STEP_TIMEOUT)?);
    }
    let total = counter.load_u64(0)?;
    let expected = args.adds * args.workers as u64;
    let mut lines = vec![
        format!(
            "- {} processes did {} remote fetch-and-adds each on one counter: it reads {total} (expected {expected}) — {}",
            args.workers,
            args.adds,
            if total == expected { "exact" } else { "WRONG" }
        ),
        format!(
            "- mean time per remote fetch-and-add, per worker: {} ns (all {} in {:.1} ms, on {} cores)",
            per_add.iter().map(u64::to_string).collect::<Vec<_>>().join(" / "),
            expected,
            elapsed.as_secs_f64() * 1e3,
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        ),
    ];
    for n in &notified {
        let text = board.to_vec(n.offset, n.len as usize)?;
        lines.push(format!(
            "- notification from node {} (immediate {}): wrote \"{}\" into the board",
            n.from,
            n.imm,
            String::from_utf8_lossy(&text)
        ));
    }
    let victim = ids[0];
    let outcome = board.revoke(victim)?;
    let c = fabric.connect(victim)?;
    c.send(b"try-write").wait()?;
    let (_, answer) = recv_text(&fabric)?;
    lines.push(format!("- revoked node {victim}'s grant of the board ({outcome:?}); its next write: {answer}"));
    let nodes = fabric.nodes()?;
    let mut t = rackwire_bench::table();
    t.set_header(["id", "name", "state", "pid"]);
    for n in &nodes {
        t.add_row([
            n.info.id.to_string(),
            n.info.name.clone(),
            if n.up { "up" } else { "down" }.to_string(),
            n.info.pid.to_string(),
        ]);
    }
    println!("{t}");
    for l in &lines {
        println!("{l}");
    }
    for &id in &ids {
        let _ = fabric.connect(id).map(|c| c.send(b"quit").wait());
    }
    out.push_str("## The fabric at work\n\n");
    out.push_str(&lines.join("\n"));
    out.push_str("\n\n");
    if total != expected {
        bail!("the shared counter is wrong: {total} != {expected}");
    }
    drop(workers);
    Ok(())
}

/// MB of the sort's data set at scale 1.
const SORT_MB: f64 = rackwire_eval::runs::SORT_RECORDS as f64 * 100.0 / 1e6;

/// The summary lines of the sort against TCP: the whole job and its shuffle.
fn sort_summary(fabric: Option<&serde_json::Value>, tcp: Option<&serde_json::Value>) -> Vec<String> {
    let (Some(f), Some(t)) = (fabric, tcp) else { return Vec::new() };
    let secs = |r: &serde_json::Value| r["secs"].as_f64().unwrap_or(f64::NAN);
    let shuffle = |r: &serde_json::Value| r["phases"]["shuffle"].as_f64().unwrap_or(f64::NAN);
    vec![
        format!(
            "- distributed sort, 4 ranks: fabric {:.3} s vs TCP {:.3} s → {:.2}x faster (both outputs validated)",
            secs(f),
            secs(t),
            secs(t) / secs(f)
        ),
        format!(
            "- its all-to-all shuffle: fabric {:.3} s vs TCP {:.3} s → {:.2}x faster",
            shuffle(f),
            shuffle(t),
            shuffle(t) / shuffle(f)
        ),
    ]
}

fn ratio_line(what: &str, ours: Option<f64>, theirs: Option<f64>, better: &str) -> Option<String> {
    let (a, b) = (ours?, theirs?);
    Some(format!("- {what}: rackwire {a:.3} vs {b:.3} → ratio {:.2} ({better})", a / b))
}

pub(crate) fn run(args: &DemoArgs) -> Result<()> {
    if !(1..=DEMO_WORKERS_MAX).contains(&args.workers) {
        bail!("--workers must be 1..={DEMO_WORKERS_MAX}");
    }
    std::fs::create_dir_all(&args.report).with_context(|| format!("report folder {}", args.report.display()))?;
    let mut md = String::from("# rackwire demo report\n\n");
    println!("== rackwire demo: a management host and {} worker processes on this machine ==", args.workers);
    tour(args, &mut md)?;

    println!("\n== benchmarks (shared-memory transport; memcpy and UCX measured in the same run) ==");
    let scale = if args.quick { 0.05 } else { 0.3 };
    let base = ShmBench { with_limit: true, peers: !args.no_peers, scale, progress: true, ..ShmBench::default() };
    let runs = [
        ShmBench { patterns: vec![Pattern::Pingpong], sizes: vec![8, 4096, 65536], ..base.clone() },
        ShmBench { patterns: vec![Pattern::Oneway], sizes: vec![65536, 1 << 20, 4 << 20], ..base.clone() },
        ShmBench { patterns: vec![Pattern::Rate], sizes: vec![64], with_limit: false, ..base.clone() },
        ShmBench {
            patterns: vec![Pattern::Table1],
            sizes: vec![4096],
            with_limit: false,
            peers: false,
            ..base.clone()
        },
    ];
    let mut report = Report::default();
    for r in &runs {
        report.merge(rackwire_bench::run_shm(r)?);
    }
    println!("{}", print_table(&report));
    let lat = |t: &str| report.find(t, "pingpong", 8).and_then(|r| r.lat_us_avg);
    let bw = |t: &str| report.find(t, "oneway", 1 << 20).and_then(|r| r.mb_per_s);
    let summary: Vec<String> = [
        ratio_line(
            "8 B ping-pong one-way latency, mean µs vs UCX posix tag_lat",
            lat("shm"),
            lat("ucx-posix"),
            "lower is better",
        ),
        ratio_line(
            "1 MiB one-way write bandwidth, MB/s vs memcpy",
            bw("shm"),
            bw("memcpy"),
            "1.0 is the physical limit",
        ),
        ratio_line(
            "1 MiB one-way write bandwidth, MB/s vs UCX posix put_bw",
            bw("shm"),
            bw("ucx-posix"),
            "higher is better",
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    println!("\n== a job of 4 ranks (rackwire launch): collectives, Open MPI's beside them where installed ==");
    let coll_rows = rackwire_bench::coll::measure(&rackwire_bench::coll::CollBench {
        ranks: vec![4],
        ops: ["barrier", "allreduce", "alltoallv"].map(String::from).to_vec(),
        sizes: vec![8, 65536],
        peers: !args.no_peers,
        edge: false,
        rack: None,
        // Collectives at 64 KiB get 100·scale timed calls: at least 20.
        scale: scale.max(0.2),
        repeat: 1,
        json: false,
    })?;
    rackwire_bench::coll::print_rows(&coll_rows);
    md.push_str("## Collectives\n\nA job of 4 ranks started by `rackwire launch`: `rackwire bench coll --ranks 4 --op barrier,allreduce,alltoallv --size 8,64K --peers` measures the same (printed by the demo).\n\n");

    println!("\n== a workload: the distributed sort (4 ranks) over the fabric and over plain TCP ==");
    let sort_scale = if args.quick { 0.05 } else { 0.25 };
    let sort = rackwire_eval::runs::EvalArgs::new("sort", 4, sort_scale);
    let sort_rows = rackwire_eval::runs::measure_rows(&sort)?;
    println!("{}", rackwire_eval::runs::table_of(&sort_rows));
    let of = |net: &str| sort_rows.iter().find(|r| r["net"] == net);
    let (mut summary, sort_lines) = (summary, sort_summary(of("fabric"), of("tcp")));
    summary.extend(sort_lines.iter().cloned());
    md.push_str(&rackwire_eval::figures::collectives(&coll_rows, &args.report)?);
    md.push_str(&format!(
        "## A workload against plain TCP\n\nThe distributed sort (HP's cluster sort: read, partition by key range, all-to-all shuffle, local sort, write; output validated as valsort does) of {} MB by 4 ranks, over the fabric and over TCP sockets between the same processes. `rackwire eval sort --scale {sort_scale}` measures the same.\n\n{}\n\n",
        (SORT_MB * sort_scale).round(),
        sort_lines.join("\n")
    ));
    md.push_str(&rackwire_eval::figures::workloads(&sort_rows, &args.report)?);

    println!("\nsummary:");
    for l in &summary {
        println!("{l}");
    }
    md.push_str("## Benchmarks\n\nShared-memory transport between two processes, with memcpy (the physical limit) and UCX over shared memory measured in the same run.\n\n");
    md.push_str(&rackwire_eval::figures::micro(&report, &args.report)?);
    md.push_str(&markdown(&report));
    md.push_str("\n## Summary\n\n");
    md.push_str(&summary.join("\n"));
    md.push('\n');
    std::fs::write(args.report.join("report.md"), md)?;
    std::fs::write(args.report.join("results.json"), serde_json::to_string_pretty(&report)?)?;
    println!("\nreport written to {}/ (report.md, results.json, SVG pictures)", args.report.display());
    Ok(())
}
