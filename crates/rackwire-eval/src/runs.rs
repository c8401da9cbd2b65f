//! `rackwire eval`: the data workloads, each over the fabric and over TCP in the same run,
//! with the energy model's estimates beside every row.
//!
//! Each run is a job: `rackwire launch -n N [--rack CONFIG] -- rackwire eval-worker ...`,
//! whose rank 0 prints one `RESULT` line (JSON). With `--repeat R` the data paths alternate
//! R times and a row gives the median time with its spread.

use std::path::{Path, PathBuf};

use crate::dfsio::DfsioJob;
use crate::energy::{self, Config, PowerTable};
use crate::grep::{GrepJob, Variant};
use crate::kv::{KvJob, Mix};
use crate::sort::SortJob;
use crate::streams::{FabricStreams, Streams, TcpStreams};
use crate::{DataPath, FabricPath, Net, RunResult, TcpPath};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;

/// Records of the sort's data set at scale 1 (200 MB).
pub const SORT_RECORDS: u64 = 2_000_000;
/// Bytes each dfsio writer writes at scale 1.
pub const DFSIO_FILE_BYTES: u64 = 64 << 20;
/// Bytes of a dfsio block (HDFS's default is 128 MiB; a smaller one gives a short run
/// several pipelines).
pub const DFSIO_BLOCK_BYTES: u64 = 8 << 20;
/// Keys of the key-value store at scale 1 (1 KB values: 100 MB).
pub const KV_KEYS: u64 = 100_000;
/// Keys per operation a kv client runs (scale 1: 50 000 operations per client).
const KV_KEYS_PER_OP: u64 = 2;
/// The highest open-loop rate per client.
const KV_RATE_MAX: f64 = 10_000_000.0;
/// Records of grep's data set at scale 1 (200 MB).
pub const GREP_RECORDS: u64 = 2_000_000;
/// Repeats at most.
const REPEAT_MAX: usize = 50;
/// Where a run's files go when no --dir is given: a RAM file system (HP's RAMFS).
const RAMFS: &str = "/dev/shm";
/// A workload's own figures, shown in the table when a row has them.
const FIGURE_KEYS: [&str; 8] = [
    "throughput_mb_per_s",
    "io_rate_avg_mb_per_s",
    "io_rate_std_mb_per_s",
    "ops_per_s",
    "lat_us_p50",
    "lat_us_p99",
    "read_share",
    "reads_retried",
];
/// Every workload's phases in the order they run.
const PHASE_ORDER: [&str; 7] = ["read", "partition", "shuffle", "sort", "write", "scan", "reduce"];
/// The first line of a rank 0's result.
const RESULT_PREFIX: &str = "RESULT ";

/// What `rackwire eval` was asked (its command line).
#[derive(Args, Clone)]
pub struct EvalArgs {
    /// `sort`, `grep`, `dfsio` (replicated block writes, TestDFSIO-like), `kv` (YCSB-like
    /// get/put mixes on a sharded store), `energy` (sort and grep at 1 and 2 cores, priced as HP's Tables 2
    /// and 3, and Marlin's Table 3 from the power table), or `all` (the micro-benchmarks, the
    /// collectives, the workloads and the energy tables, into a report with pictures), or
    /// `dsm` (SPLASH-2's algorithms over the shared virtual memory at 1, 2, 4... ranks up to
    /// --ranks, a rank per host of --rack, against one process on plain memory).
    #[arg(value_parser = ["sort", "grep", "dfsio", "kv", "energy", "dsm", "all"])]
    pub workload: String,
    /// With `dsm`: the applications (fft, lu, radix, water).
    #[arg(long, value_delimiter = ',', default_value = "fft,lu,radix,water")]
    pub app: Vec<String>,
    /// With `dsm`: the edge transport delivers each connection's frames in the order they were
    /// sent (MultiEdge's 2L-1G, whose links kept order; without it, its 2Lu-1G).
    #[arg(long)]
    pub ordered: bool,
    /// With `dsm` and at least two rank counts above 1: the rank count the model predicts for
    /// (MultiEdge's 16 nodes; its 1L-10G had 4).
    #[arg(long, default_value_t = 16)]
    pub predict: usize,
    /// With `dsm`: the rows of an earlier `--json` run (its file) instead of measuring: its
    /// tables and model again (e.g. for another --predict).
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
    /// With `all`: the report folder (created; report.md and its SVG pictures).
    #[arg(long, default_value = "rackwire-eval-report")]
    pub report: PathBuf,
    /// With `all`: leave out the peers (UCX, Open MPI) even where installed.
    #[arg(long)]
    pub no_peers: bool,
    /// Ranks of the job.
    #[arg(long, default_value_t = 4)]
    pub ranks: usize,
    /// Data paths, in the same run: fabric, tcp, and for `kv` fabric-rpc (the store's
    /// requests as messages over the fabric, TCP's algorithm on the fabric's transport)
    /// [default: fabric,tcp; with `kv` fabric,fabric-rpc,tcp].
    #[arg(long, value_delimiter = ',')]
    pub net: Vec<String>,
    /// Run the ranks over the hosts of this virtual rack (root), in blocks; TCP crosses its
    /// shaped rails. A rail shaped to 1 Gbit/s stands for 1GbE, the fabric within a memory
    /// domain for PCIe.
    #[arg(long, value_name = "CONFIG")]
    pub rack: Option<PathBuf>,
    /// Pin the ranks to this many cores (HP's 1-, 2- and 4-core configurations, as far as
    /// this machine has cores; each rank to cores of its own where its host has enough, the
    /// output says when they share); the energy model prices
    /// each rank as a node with this many.
    #[arg(long)]
    pub cores: Option<usize>,
    /// With `kv`: YCSB core workloads (A: 50% reads, B: 95%, C: reads only) and the OSU
    /// paper's 100% put mix (`put`).
    #[arg(long, value_delimiter = ',', default_value = "A,B,C,put")]
    pub mix: Vec<String>,
    /// With `kv`: open loop, each client's operations due at this rate per second, latency
    /// counted from when each was due (corrects for coordinated omission); default: closed
    /// loop, one operation outstanding per client.
    #[arg(long)]
    pub rate: Option<f64>,
    /// With `grep`: variants (LoN-LoC, LoN-HiC, HiN-LoC, HiN-HiC).
    #[arg(long, value_delimiter = ',', default_value = "LoN-LoC,LoN-HiC,HiN-LoC,HiN-HiC")]
    pub variant: Vec<String>,
    /// With `dfsio`: write the block files to --dir and `fsync` each finished block (point
    /// --dir at a disk; the default folder is a RAM file system).
    #[arg(long)]
    pub fsync: bool,
    /// Data set size scale (1.0: 2 million records, 200 MB; dfsio: 64 MiB per writer).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Run each comparison this many times, the data paths alternating, and report the
    /// median with the spread.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// Folder for the workloads' files [default: /dev/shm, a RAM file system].
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Seed of the data sets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Component power table (TOML) instead of the shipped one.
    #[arg(long)]
    pub power: Option<PathBuf>,
    /// One JSON document with a `rows` array instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl EvalArgs {
    /// `rackwire eval WORKLOAD --ranks RANKS --scale SCALE` with every other option at its
    /// default.
    pub fn new(workload: &str, ranks: usize, scale: f64) -> EvalArgs {
        EvalArgs {
            workload: workload.into(),
            app: crate::dsm::APPS.iter().map(|a| a.name().to_string()).collect(),
            ordered: false,
            predict: 16,
            from: None,
            ranks,
            net: Vec::new(),
            rack: None,
            cores: None,
            variant: Variant::ALL.iter().map(|v| v.name().to_string()).collect(),
            mix: ["A", "B", "C", "put"].map(String::from).to_vec(),
            rate: None,
            scale,
            repeat: 1,
            dir: None,
            seed: 1,
            power: None,
            json: false,
            report: PathBuf::from("rackwire-eval-report"),
            fsync: false,
            no_peers: false,
        }
    }
}

/// One rank's orders (`rackwire eval-worker`).
#[derive(Args, Clone, Debug)]
pub struct WorkerArgs {
    #[arg(long)]
    pub(crate) workload: String,
    #[arg(long)]
    pub(crate) net: String,
    #[arg(long)]
    pub(crate) records: u64,
    #[arg(long)]
    pub(crate) seed: u64,
    #[arg(long)]
    pub(crate) dir: PathBuf,
    #[arg(long)]
    pub(crate) variant: Option<String>,
    #[arg(long)]
    pub(crate) cores: Option<usize>,
    #[arg(long)]
    pub(crate) fsync: bool,
    #[arg(long)]
    pub(crate) rate: Option<f64>,
}

/// The `k` cores rank `local_rank` of a host takes, each rank given `k` of its own: the next
/// `k` of the `usable` cores in turn, so ranks of one host share cores only when it has fewer
/// than `k` per rank (then they wrap around).
pub fn rank_cores(usable: &[usize], local_rank: usize, k: usize) -> Vec<usize> {
    if usable.is_empty() {
        return Vec::new();
    }
    (0..k).map(|i| usable[(local_rank * k + i) % usable.len()]).collect()
}

/// Keep this process (and the threads it starts) on `k` cores of its own among the cores it
/// may use (its host's, in a virtual rack), chosen by its rank on its host.
fn pin_to_cores(k: usize) -> Result<()> {
    let usable = rackwire_rack::cores::usable().context("the cores this process may use")?;
    if k == 0 || k > usable.len() {
        bail!("--cores {k}: this host offers 1..={}", usable.len());
    }
    let local_rank = std::env::var(rackwire::vars::LOCAL_RANK).ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    rackwire_rack::cores::pin_this_thread(&rank_cores(&usable, local_rank, k)).context("pinning to cores")?;
    Ok(())
}

/// Whether the ranks of a job get `k` cores each of their own: `ranks` spread in blocks over
/// `hosts` hosts (one: this machine) of `cores` cores each.
pub fn cores_note(ranks: usize, hosts: usize, cores: usize, k: Option<usize>) -> String {
    let Some(k) = k else { return "cores: not pinned (the scheduler places the ranks)".into() };
    let per_host = ranks.div_ceil(hosts.max(1));
    if per_host * k <= cores {
        format!("cores: each rank on {k} of its own ({per_host} rank(s) per host of {cores} cores)")
    } else {
        format!(
            "cores: ranks share cores ({per_host} rank(s) per host × {k} core(s) on {cores}; this machine has too few)"
        )
    }
}

/// [`cores_note`] for this run: its ranks, the rack's hosts (or this machine) and their cores.
pub fn cores_note_of(a: &EvalArgs) -> Result<String> {
    let here = rackwire_rack::cores::usable().map(|c| c.len()).unwrap_or(1);
    Ok(match rack_config(a.rack.as_deref())? {
        None => cores_note(a.ranks, 1, here, a.cores),
        Some(cfg) => {
            let hosts: Vec<_> = cfg.hosts.iter().filter(|h| !h.remote).collect();
            let cores =
                hosts.iter().map(|h| if h.cores.is_empty() { here } else { h.cores.len() }).min().unwrap_or(here);
            cores_note(a.ranks, hosts.len(), cores, a.cores)
        }
    })
}

/// A rank of an eval job: runs the workload once over one data path.
pub fn worker(a: &WorkerArgs) -> Result<()> {
    if let Some(k) = a.cores {
        pin_to_cores(k)?;
    }
    let mut g = rackwire_coll::Group::from_env()?;
    let net = Net::parse(&a.net)?;
    let tcp = crate::net::tcp_bind_from_env();
    let result = match a.workload.as_str() {
        // Made of collective steps: a data path that exchanges blocks.
        "sort" | "grep" => {
            let mut path: Box<dyn DataPath> = match net {
                Net::Fabric => Box::new(FabricPath::new(&g)),
                Net::Tcp => Box::new(TcpPath::connect(&mut g, &tcp)?),
                Net::FabricRpc => bail!("fabric-rpc is a data path of kv only"),
            };
            if a.workload == "sort" {
                SortJob { records: a.records, seed: a.seed, dir: a.dir.clone() }.run(&mut g, path.as_mut())?
            } else {
                let variant = Variant::parse(a.variant.as_deref().unwrap_or("HiN-LoC"))?;
                GrepJob { records: a.records, seed: a.seed, variant, dir: a.dir.clone() }.run(&mut g, path.as_mut())?
            }
        }
        // Point to point: message streams between the ranks.
        "dfsio" | "kv" => {
            let mut streams: Box<dyn Streams> = match net {
                Net::Fabric | Net::FabricRpc => Box::new(FabricStreams::new(&mut g)?),
                Net::Tcp => Box::new(TcpStreams::connect(&mut g, &tcp)?),
            };
            if a.workload == "dfsio" {
                // `records` carries the bytes per writer here.
                let job = DfsioJob {
                    file_bytes: a.records,
                    block_bytes: DFSIO_BLOCK_BYTES.min(a.records.next_multiple_of(8)),
                    seed: a.seed,
                    dir: a.dir.clone(),
                    fsync: a.fsync,
                };
                job.run(&mut g, streams.as_mut())?
            } else {
                // `records` carries the keys here. Reads of other ranks' keys over the fabric
                // are one-sided (as requests over fabric-rpc and TCP); every path sends
                // updates to the owner as messages.
                let job = KvJob {
                    keys: a.records,
                    ops: (a.records / KV_KEYS_PER_OP).max(1),
                    mix: Mix::parse(a.variant.as_deref().unwrap_or("A"))?,
                    rate: a.rate,
                    seed: a.seed,
                    one_sided: net == Net::Fabric,
                };
                job.run(&mut g, streams.as_mut())?
            }
        }
        other => bail!("unknown workload {other:?}"),
    };
    if g.rank() == 0 {
        print_result(&result)?;
    }
    g.leave()?;
    Ok(())
}

/// One run of a job: `workload` over `net`.
struct Run<'a> {
    workload: &'a str,
    variant: Option<&'a str>,
    net: Net,
    records: u64,
}

fn run_job(a: &EvalArgs, dir: &Path, r: &Run<'_>) -> Result<RunResult> {
    let mut cmd = rackwire_bench::spawn::job(a.ranks, a.rack.as_deref(), rackwire_bench::spawn::EVAL_WORKER)?;
    cmd.args(["--workload", r.workload, "--net", r.net.name()])
        .args(["--records", &r.records.to_string(), "--seed", &a.seed.to_string()])
        .arg("--dir")
        .arg(dir);
    if let Some(v) = r.variant {
        cmd.args(["--variant", v]);
    }
    if let Some(rate) = a.rate {
        cmd.args(["--rate", &rate.to_string()]);
    }
    if let Some(k) = a.cores {
        cmd.args(["--cores", &k.to_string()]);
    }
    if a.fsync {
        cmd.arg("--fsync");
    }
    job_result(cmd, &format!("{} job over {}", r.workload, r.net.name()))
}

/// Run the job `cmd` (its rank 0 prints a result line) and read its result; `what` names it
/// in errors.
pub(crate) fn job_result(mut cmd: std::process::Command, what: &str) -> Result<RunResult> {
    let rapl = crate::rapl::Rapl::start(Path::new(crate::rapl::POWERCAP));
    let o = cmd.output().with_context(|| format!("running the {what}"))?;
    let rapl_joules = rapl.and_then(|r| r.joules());
    let out = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        bail!("the {what} failed:\n{out}{}", String::from_utf8_lossy(&o.stderr));
    }
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(RESULT_PREFIX))
        .with_context(|| format!("the {what} printed no result:\n{out}"))?;
    let mut result: RunResult = serde_json::from_str(line)?;
    // Over the whole job (launch and setup included), so above the timed phases' share.
    result.rapl_joules = rapl_joules;
    Ok(result)
}

/// Print a rank 0's result line (what [`job_result`] reads).
pub(crate) fn print_result(result: &RunResult) -> Result<()> {
    println!("{RESULT_PREFIX}{}", serde_json::to_string(result)?);
    Ok(())
}

/// The median of `v` (sorted in place; `v` not empty): the benchmarks' own helper's.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    rackwire_bench::repeat::median_spread(v).0
}

/// The run whose time is the median of `runs` (the nearest one): it speaks for them (its
/// phases and CPU use).
pub fn median_run(runs: &[RunResult]) -> &RunResult {
    let mut secs: Vec<f64> = runs.iter().map(|r| r.secs).collect();
    let med = median(&mut secs);
    runs.iter().min_by(|x, y| (x.secs - med).abs().total_cmp(&(y.secs - med).abs())).expect("one run")
}

/// The description of the rack `rack` names (a file, or the name of a rack that is up), if given.
fn rack_config(rack: Option<&Path>) -> Result<Option<rackwire_rack::RackConfig>> {
    let Some(rack) = rack else { return Ok(None) };
    Ok(Some(if rack.is_file() {
        rackwire_rack::RackConfig::parse(&std::fs::read_to_string(rack)?)?
    } else {
        rackwire_rack::load(&rack.to_string_lossy())?.config
    }))
}

/// The hosts of the rack `rack` that run ranks, if a rack is given.
pub fn rack_hosts(rack: Option<&Path>) -> Result<Option<usize>> {
    Ok(rack_config(rack)?.map(|cfg| cfg.hosts.iter().filter(|h| !h.remote).count()))
}

/// What the TCP path's pairs of ranks crossed: every pair over the host's loopback (no rack),
/// or how many over the rails and how many within a host.
pub fn tcp_pairs_note(a: &EvalArgs) -> Result<String> {
    let pairs = a.ranks * a.ranks.saturating_sub(1) / 2;
    Ok(match rack_hosts(a.rack.as_deref())? {
        None => format!("TCP: all {pairs} pairs of ranks over this machine's loopback (no rack)"),
        Some(hosts) => {
            let (across, within) = rackwire_rack::place::pairs_across(a.ranks, hosts);
            format!(
                "TCP: {across} of {pairs} pairs of ranks cross the rails, {within} within a host (over its loopback); {} ranks on {hosts} hosts",
                a.ranks
            )
        }
    })
}

/// The rails' rate of the rack (Gbit/s), if shaped.
pub fn rail_gbit(rack: Option<&Path>) -> Result<Option<f64>> {
    let Some(cfg) = rack_config(rack)? else { return Ok(None) };
    Ok(cfg
        .rails
        .first()
        .and_then(|r| r.rate.as_deref())
        .and_then(rackwire_rack::rate_bytes_per_s)
        .map(|b| b as f64 * 8.0 / 1e9))
}

/// What a host of the rack can take in over all its rails (bytes/s), if they are shaped.
pub fn rails_bytes_per_s(rack: Option<&Path>) -> Result<Option<f64>> {
    let Some(cfg) = rack_config(rack)? else { return Ok(None) };
    let rates: Option<Vec<u64>> =
        cfg.rails.iter().map(|r| r.rate.as_deref().and_then(rackwire_rack::rate_bytes_per_s)).collect();
    Ok(rates.filter(|r| !r.is_empty()).map(|r| r.iter().sum::<u64>() as f64))
}

/// Every measured row of one workload (and variant) at one core count: each data path's
/// repeats.
pub struct Measured {
    /// The workload (and variant) as its rows name it.
    pub pattern: String,
    /// The cores the ranks were pinned to (none: not pinned).
    pub cores: Option<usize>,
    /// Each data path's repeats.
    pub runs: Vec<(Net, Vec<RunResult>)>,
}

/// Refuse arguments no run can take (ranks beyond a job's, a scale or repeat of 0).
pub fn check(a: &EvalArgs) -> Result<()> {
    if !(1..=rackwire_coll::RANKS_MAX).contains(&a.ranks) {
        bail!("--ranks must be 1..={}", rackwire_coll::RANKS_MAX);
    }
    if !(1..=REPEAT_MAX).contains(&a.repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    if !(a.scale > 0.0 && a.scale <= 20.0) {
        bail!("--scale must be in (0, 20]");
    }
    for n in &a.net {
        let net = Net::parse(n)?;
        // Under `all` and `energy`, each workload takes the given paths it runs over.
        if !net.carries(&a.workload) && !["all", "energy"].contains(&a.workload.as_str()) {
            bail!("--net {n}: {} does not run over it (fabric-rpc is the key-value store's)", a.workload);
        }
    }
    let have = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if let Some(k) = a.cores.filter(|&k| k == 0 || k > have) {
        bail!("--cores {k}: this machine offers 1..={have}");
    }
    for v in &a.variant {
        Variant::parse(v)?;
    }
    for app in &a.app {
        crate::dsm::App::parse(app)?;
    }
    for m in &a.mix {
        Mix::parse(m)?;
    }
    if a.rate.is_some_and(|r| !(r > 0.0 && r.is_finite() && r <= KV_RATE_MAX)) {
        bail!("--rate must be in (0, {KV_RATE_MAX}] operations per second");
    }
    Ok(())
}

/// Run `workload` (and `variant`) over every path of `a.net`, `a.repeat` times, in a work
/// folder of its own.
pub fn measure_set(a: &EvalArgs, workload: &str, variant: Option<&str>) -> Result<Measured> {
    let dir = work_dir(a)?;
    let m = measure(a, &dir, workload, variant);
    let _ = std::fs::remove_dir_all(&dir);
    m
}

fn measure(a: &EvalArgs, dir: &Path, workload: &str, variant: Option<&str>) -> Result<Measured> {
    let nets: Vec<Net> = if a.net.is_empty() {
        Net::defaults(workload).to_vec()
    } else {
        let given: Vec<Net> = a.net.iter().map(|n| Net::parse(n)).collect::<Result<_, _>>()?;
        // Under `all`, each workload takes the given paths it runs over.
        given.into_iter().filter(|n| n.carries(workload)).collect()
    };
    let base = match workload {
        "sort" => SORT_RECORDS,
        "dfsio" => DFSIO_FILE_BYTES,
        "kv" => KV_KEYS,
        _ => GREP_RECORDS,
    };
    let records = ((base as f64 * a.scale) as u64).max(a.ranks as u64);
    let mut runs: Vec<(Net, Vec<RunResult>)> = nets.iter().map(|&n| (n, Vec::new())).collect();
    for rep in 0..a.repeat {
        // Alternate which path goes first, so neither always runs on a warmer machine.
        let order: Vec<usize> = if rep % 2 == 0 { (0..nets.len()).collect() } else { (0..nets.len()).rev().collect() };
        for i in order {
            let r = Run { workload, variant, net: nets[i], records };
            let res = run_job(a, dir, &r)?;
            runs[i].1.push(res);
        }
    }
    let pattern = match variant {
        Some(v) => format!("{workload}/{v}"),
        None => workload.to_string(),
    };
    Ok(Measured { pattern, cores: a.cores, runs })
}

/// Rows for one measured set: each path's median run, its speedup over TCP, and the energy
/// model's estimate.
fn rows_of(m: &Measured, table: &PowerTable, gbit: Option<f64>) -> Result<Vec<serde_json::Value>> {
    // Each repeat's TCP time over this path's time in the same repeat: the speedup is their
    // median, with their spread.
    let tcp_runs = m.runs.iter().find(|(n, _)| *n == Net::Tcp).map(|(_, rs)| rs);
    let mut rows = Vec::new();
    for (net, rs) in &m.runs {
        let mut secs: Vec<f64> = rs.iter().map(|r| r.secs).collect();
        let med = median(&mut secs);
        let run = median_run(rs);
        let kind = energy::network_kind(&run.transport, gbit);
        let cfg = Config { network: kind.into(), storage: "RAMFS".into(), cores: m.cores.unwrap_or(1) as u32 };
        let est = table.estimate_run(&cfg, run)?;
        let mut ratios: Vec<f64> =
            tcp_runs.map(|t| t.iter().zip(rs).map(|(t, r)| t.secs / r.secs).collect()).unwrap_or_default();
        let speedup = (!ratios.is_empty()).then(|| median(&mut ratios));
        let (speedup_lo, speedup_hi) = (ratios.first().copied(), ratios.last().copied());
        let phases: serde_json::Map<String, serde_json::Value> =
            run.phases.iter().map(|p| (p.name.clone(), json!(p.secs))).collect();
        let mut row = json!({
            "transport": run.transport, "net": net.name(), "pattern": m.pattern, "ranks": run.ranks,
            "cores": m.cores, "bytes": run.bytes, "secs": med, "secs_lo": secs[0], "secs_hi": secs[secs.len() - 1],
            "repeats": secs.len(), "mb_per_s": run.bytes as f64 / med / 1e6,
            "speedup": speedup, "speedup_lo": speedup_lo, "speedup_hi": speedup_hi, "phases": phases, "cpu_secs": run.cpu_secs, "host_cpu_secs": run.host_cpu_secs, "checked": run.checked,

            "energy_model": { "network": kind, "joules_est": est.joules, "watts_est": est.watts,
                              "work_per_joule_est": est.work_per_joule, "rapl_joules_measured": run.rapl_joules },
        });
        // The workload's own figures (TestDFSIO's rates; YCSB's operations and latencies) as
        // keys of the row.
        if let Some(obj) = row.as_object_mut() {
            for (k, v) in &run.extra {
                obj.insert(k.clone(), json!(v));
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

pub(crate) fn work_dir(a: &EvalArgs) -> Result<PathBuf> {
    let base = match &a.dir {
        Some(d) => d.clone(),
        None if Path::new(RAMFS).is_dir() => PathBuf::from(RAMFS),
        None => std::env::temp_dir(),
    };
    let dir = base.join(format!("rackwire-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// The component power table: `--power`'s, or the shipped one.
pub fn load_table(a: &EvalArgs) -> Result<PowerTable> {
    Ok(match &a.power {
        Some(p) => {
            PowerTable::parse(&std::fs::read_to_string(p).with_context(|| format!("power table {}", p.display()))?)?
        }
        None => PowerTable::shipped(),
    })
}

/// The arguments with a rack description replaced by the name of the rack it brought up, and
/// the guard that takes it down.
pub fn rack_once(a: &EvalArgs) -> Result<(EvalArgs, Option<rackwire_rack::DownOnDrop>)> {
    let mut a = a.clone();
    let Some(rack) = a.rack.clone().filter(|r| r.is_file()) else { return Ok((a, None)) };
    // Checked before a rack is brought up for nothing.
    check(&a)?;
    let (state, down) = rackwire_bench::spawn::rack_up(&rack, false)?;
    a.rack = Some(PathBuf::from(&state.config.name));
    Ok((a, down))
}

/// `rackwire eval sort|grep`: the rows, printed or returned.
pub fn measure_rows(a: &EvalArgs) -> Result<Vec<serde_json::Value>> {
    check(a)?;
    let table = load_table(a)?;
    let gbit = rail_gbit(a.rack.as_deref())?;
    let mut rows = Vec::new();
    let variants: Vec<Option<String>> = match a.workload.as_str() {
        "grep" => {
            a.variant.iter().map(|v| Variant::parse(v).map(|v| Some(v.name().to_string()))).collect::<Result<_, _>>()?
        }
        "kv" => a.mix.iter().map(|m| Mix::parse(m).map(|m| Some(m.name().to_string()))).collect::<Result<_, _>>()?,
        _ => vec![None],
    };
    for v in variants {
        let m = measure_set(a, &a.workload, v.as_deref())?;
        rows.extend(rows_of(&m, &table, gbit)?);
    }
    Ok(rows)
}

/// A row's phases in the order they run (the JSON object is keyed by name).
pub fn phases_in_order(r: &serde_json::Value) -> Vec<(&str, f64)> {
    let order = |k: &str| PHASE_ORDER.iter().position(|p| *p == k).unwrap_or(PHASE_ORDER.len());
    let mut phases: Vec<(&str, f64)> = r["phases"]
        .as_object()
        .map(|p| p.iter().map(|(k, v)| (k.as_str(), v.as_f64().unwrap_or(0.0))).collect())
        .unwrap_or_default();
    phases.sort_by_key(|(k, _)| order(k));
    phases
}

/// The rows as a table.
pub fn table_of(rows: &[serde_json::Value]) -> comfy_table::Table {
    let mut t = rackwire_bench::table();
    t.set_header([
        "workload",
        "path",
        "ranks",
        "MB",
        "secs",
        "spread",
        "MB/s",
        "speedup",
        "phases (s)",
        "figures",
        "J (est.)",
    ]);
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let phases = phases_in_order(r).iter().map(|(k, v)| format!("{k} {v:.3}")).collect::<Vec<_>>().join(", ");
        t.add_row([
            r["pattern"].as_str().unwrap_or("").to_string(),
            format!("{} ({})", r["net"].as_str().unwrap_or(""), r["transport"].as_str().unwrap_or("")),
            r["ranks"].to_string(),
            format!("{:.0}", f("bytes") / 1e6),
            format!("{:.3}", f("secs")),
            format!("{:.3}–{:.3}", f("secs_lo"), f("secs_hi")),
            format!("{:.0}", f("mb_per_s")),
            match (r["speedup"].as_f64(), r["speedup_lo"].as_f64(), r["speedup_hi"].as_f64()) {
                (Some(s), Some(lo), Some(hi)) if r["repeats"].as_u64() > Some(1) => {
                    format!("{s:.2}x ({lo:.2}–{hi:.2})")
                }
                (Some(s), ..) => format!("{s:.2}x"),
                _ => String::new(),
            },
            phases,
            FIGURE_KEYS
                .iter()
                .filter_map(|k| r[*k].as_f64().map(|v| format!("{k} {v:.1}")))
                .collect::<Vec<_>>()
                .join("\n"),
            format!("{:.0}", r["energy_model"]["joules_est"].as_f64().unwrap_or(f64::NAN)),
        ]);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the core rule by hand: 2 ranks × 1 core on cores [4, 5] get one each; 2 ranks × 2
    // cores on 4 cores get disjoint pairs; 3 ranks × 1 core on 2 cores wrap (the third shares
    // the first's); and the note says "of its own" exactly when ranks per host × K fit the
    // host's cores, "share" otherwise, and "not pinned" without --cores.
    #[test]
    fn ranks_get_cores_of_their_own_where_there_are_enough() {
        assert_eq!((rank_cores(&[4, 5], 0, 1), rank_cores(&[4, 5], 1, 1)), (vec![4], vec![5]));
        assert_eq!((rank_cores(&[0, 1, 2, 3], 0, 2), rank_cores(&[0, 1, 2, 3], 1, 2)), (vec![0, 1], vec![2, 3]));
        assert_eq!(rank_cores(&[0, 1], 2, 1), vec![0]);
        assert!(rank_cores(&[], 0, 1).is_empty());
        assert!(cores_note(4, 4, 1, Some(1)).contains("of its own"));
        assert!(cores_note(2, 1, 2, Some(1)).contains("of its own"));
        assert!(cores_note(4, 1, 2, Some(1)).contains("share"));
        assert!(cores_note(4, 2, 2, Some(2)).contains("share"));
        assert!(cores_note(4, 1, 2, None).contains("not pinned"));
    }
}
