//! `rackwire`: run a management host, inspect a fabric, benchmark it, or see it all in a demo.

#![deny(unsafe_code)]

mod demo;
mod doctor;
mod holder;
mod inspect;
mod launch;
mod mh_cmd;
mod package_files;
mod rack;
mod sim;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use rackwire_bench::{parse_size, print_table, Pattern, ShmBench};

/// Most repeats of the RMA micro-benchmarks' whole comparison.
const BENCH_REPEAT_MAX: usize = 20;

/// rackwire: a rack-area network stack in software.
#[derive(Parser)]
#[command(name = "rackwire", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Log lines as text, or as one JSON object per line (structured logs).
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
}

/// Logs go out as JSON lines (`--log-format json`).
static LOG_JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Where the management host is and the secret that admits us.
#[derive(Args, Clone)]
pub(crate) struct FabricArgs {
    /// Management host address, host:port [env: RACKWIRE_MH]
    #[arg(long)]
    mh: Option<String>,
    /// File holding the fabric's shared secret [env: RACKWIRE_SECRET_FILE, or RACKWIRE_SECRET]
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Configuration file (TOML) [env: RACKWIRE_CONFIG]
    #[arg(long)]
    config: Option<PathBuf>,
}

impl FabricArgs {
    /// The configuration: file, then environment, then these flags.
    pub(crate) fn resolve(&self, name: &str) -> Result<rackwire::FabricConfig> {
        if let Some(c) = &self.config {
            std::env::set_var(rackwire::vars::CONFIG, c);
        }
        let mut cfg = rackwire::FabricConfig::from_env()?;
        if let Some(m) = &self.mh {
            cfg.mh = m.clone();
        }
        if let Some(p) = &self.secret_file {
            cfg.secret = rackwire::read_secret_file(p)?;
        }
        if std::env::var_os(rackwire::vars::NAME).is_none() {
            // A name of its own: the node keeps its key pair, and so its id, across runs.
            cfg.name = name.into();
            cfg.transient = false;
        }
        Ok(cfg)
    }
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Load the file and say what is wrong with it, line by line: its syntax, unknown keys,
    /// values of the wrong type, a missing management host or secret, a secret file others may
    /// read, values out of range.
    Check {
        /// The file [default: RACKWIRE_CONFIG, else /etc/rackwire/rackwire.toml].
        file: Option<PathBuf>,
    },
    /// Print the file's reference (Markdown): every key, its default, and the environment
    /// variable or flag that also sets it.
    Reference,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a management host: admits nodes, names them and their regions, keeps grants. Its
    /// settings come from the flags, else the configuration file's `[management_host]` table.
    Mh(mh_cmd::MhArgs),
    /// Check a configuration file as every command reads it: each problem on a line of its own
    /// (the file's line, what is wrong), exit status 1 when there is any.
    Config {
        #[command(subcommand)]
        what: ConfigCmd,
    },
    /// Check this host for what rackwire needs and say what to fix, each finding with the
    /// command that fixes it: the configuration, the secret file, TUN, reverse-path filtering,
    /// socket buffers, each link's address, port and MTU, shared memory, and (unless
    /// --offline) the management host, the clock against its clock, and every other node's
    /// links reached over the edge transport. Exit status 1 when a check fails.
    Doctor {
        /// Configuration file [env: RACKWIRE_CONFIG; default /etc/rackwire/rackwire.toml].
        #[arg(long)]
        config: Option<PathBuf>,
        /// One JSON document instead of lines.
        #[arg(long)]
        json: bool,
        /// Check this host only: do not reach the management host or the other nodes.
        #[arg(long)]
        offline: bool,
    },
    /// List the nodes the management host knows.
    Nodes {
        #[command(flatten)]
        fabric: FabricArgs,
        /// One JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List published regions and recorded grants.
    Regions {
        #[command(flatten)]
        fabric: FabricArgs,
        /// One JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Micro-benchmarks between two processes on this machine.
    Bench(BenchArgs),
    /// Bring up a management host and several nodes on this machine, exercise them, run the
    /// benchmarks, and write a report.
    Demo(demo::DemoArgs),
    /// Run the edge transport in the deterministic simulator: `--seeds N` for a swarm,
    /// `--seed S --stats` to reproduce one run with its counters.
    Sim(sim::SimArgs),
    /// A virtual rack on this machine: hosts as network namespaces, rails as shaped links
    /// through bridges, a management host, and an agent with the virtual NIC rw0 per host.
    #[command(subcommand)]
    Rack(rack::RackCmd),
    /// A host's node agent: joins the fabric (configured by RACKWIRE_* variables or --config)
    /// and runs the virtual NIC rw0 until stopped.
    Agent {
        #[command(flatten)]
        fabric: FabricArgs,
        #[command(flatten)]
        agent: rack::AgentArgs,
    },
    /// Start the N ranks of a job on this machine, as mpirun does: each rank gets
    /// RACKWIRE_RANK, RACKWIRE_SIZE, RACKWIRE_JOB and the job's own RACKWIRE_JOB_TOKEN (only
    /// its ranks can join it) (and a management host of the job's own unless RACKWIRE_MH is set); output lines are prefixed with the rank; when a rank fails
    /// the others are stopped and its exit status is the launcher's.
    Launch(launch::LaunchArgs),
    /// The data workloads, each over the fabric and over TCP in the same run, with the energy
    /// model's estimates: `sort` (HP's cluster sort), `grep` (its four variants), `energy`
    /// (HP's efficiency tables from measured runs, and Marlin's power table).
    Eval(rackwire_eval::runs::EvalArgs),
    /// (internal) A rank of `rackwire eval`.
    #[command(name = rackwire_bench::spawn::EVAL_WORKER, hide = true)]
    EvalWorker(rackwire_eval::runs::WorkerArgs),
    /// (internal) A rank of `rackwire bench coll`.
    #[command(name = rackwire_bench::spawn::COLL_WORKER, hide = true)]
    CollWorker {
        #[arg(long, value_delimiter = ',')]
        op: Vec<String>,
        #[arg(long)]
        size: String,
        #[arg(long)]
        scale: f64,
    },
    /// (internal) One side of `rackwire bench stripe`.
    #[command(name = rackwire_bench::spawn::STRIPE_WORKER, hide = true)]
    StripeWorker { role: String, bytes: u64 },
    /// (internal) One side of `rackwire bench lang`, in Rust.
    #[command(name = rackwire_bench::spawn::LANG_WORKER, hide = true)]
    LangWorker { role: String, iters: u64 },
    /// (internal) The responder side of `rackwire bench`.
    #[command(name = rackwire_bench::spawn::RESPONDER, hide = true)]
    BenchResponder,
    /// (internal) Write the manual pages and shell completions into DIR, for packages.
    #[command(name = "package-files", hide = true)]
    PackageFiles { dir: PathBuf },
    /// (internal) A worker node of `rackwire demo`.
    #[command(name = rackwire_bench::spawn::DEMO_WORKER, hide = true)]
    DemoWorker,
    /// (internal) Join as node NAME, send one message (hex) to the node named --to, leave:
    /// for tests of what the virtual NIC takes from a peer.
    #[command(name = "send-raw", hide = true)]
    SendRaw {
        #[command(flatten)]
        fabric: FabricArgs,
        /// This node's name.
        #[arg(long)]
        name: String,
        /// The receiving node's name.
        #[arg(long)]
        to: String,
        /// The message, in hex.
        #[arg(long)]
        hex: String,
    },
}

#[derive(Args)]
struct BenchArgs {
    /// `vnic`: the virtual NIC against the veth path between the same hosts (in one rack and
    /// across two), in a virtual rack (root). `stripe`: the edge transport striped over the shaped rails of the rack
    /// given with --config, against one iperf3 TCP stream on one rail (root). `coll`:
    /// collectives of a job of --ranks ranks by the OSU method (with --peers, Open MPI's in the
    /// same run). Without it: the RMA micro-benchmarks.
    /// `lang`: the same ping-pong and 1 MiB writes from Rust, C and Python in the same run.
    /// `seal`: the edge transport's 64 B ping-pong and 1 MiB one-way writes with frames sealed
    /// and unsealed, alternated --repeat times (frames of --mtu bytes).
    /// `served`: a served region's reads, writes and atomics over shared memory against a
    /// mapped region's, alternated --repeat times. `ofi`: libfabric's fi_pingpong over the
    /// rackwire provider and libfabric's shm, tcp and udp;ofi_rxd providers, --repeat times.
    /// `mpi`: one MPI program under Open MPI over the provider, over vader and over tcp.
    #[arg(value_parser = ["vnic", "stripe", "coll", "lang", "seal", "served", "ofi", "mpi"])]
    suite: Option<String>,
    /// With `coll`: ranks (comma-separated for several runs).
    #[arg(long, value_delimiter = ',', default_value = "2")]
    ranks: Vec<usize>,
    /// With `coll`: collectives (barrier, bcast, scatter, alltoallv, allreduce).
    #[arg(long, value_delimiter = ',', default_value = "barrier,bcast,scatter,alltoallv,allreduce")]
    op: Vec<String>,
    /// Run the whole comparison this many times (ours and the peers' one after the other in
    /// each run) and report each row's median run and each ratio's median, with the spread.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// With `stripe`: the rack description (e.g. examples/racks/2l-1g.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// With `coll`: run the ranks (ours, and Open MPI's over TCP with --peers) over the hosts
    /// of this virtual rack (root), in blocks, as `launch --rack` does. With `ofi` and `mpi`:
    /// run the two ends in its first two hosts (in memory domains of their own), over its rails.
    /// Without a suite: the RMA micro-benchmarks between its first two hosts over its rails
    /// (MultiEdge's Fig. 2: --pattern pingpong,oneway,twoway and --size 64,1K,16K,64K,1M unless
    /// given).
    #[arg(long, value_name = "CONFIG")]
    rack: Option<PathBuf>,
    /// With `stripe`: MiB to stream [default: what the shaped rails carry in the time iperf3
    /// runs, so both pay their start-up once over the same stretch; 256 on unshaped rails].
    #[arg(long)]
    mib: Option<u64>,
    /// Transport to measure: shared memory, or the edge transport over loopback UDP links
    /// (`udp-unsealed`: with its frames unsealed, to measure what sealing costs). (`rails`:
    /// the edge transport over a rack host's rails, which `--rack` runs in that host.)
    #[arg(long, default_value = "shm", value_parser = ["shm", "udp", "udp-unsealed", "rails"])]
    transport: String,
    /// With --transport udp: links to stripe over.
    #[arg(long, default_value_t = 1)]
    links: usize,
    /// With --transport udp: largest frame per link (loopback carries up to 65507) [default:
    /// 65000; with `seal`: 1472, an Ethernet frame's]. With `vnic`: MTUs (comma-separated, e.g.
    /// 1500,9000,16384,32768,65520) to measure TCP and UDP over rw0 and over a veth at each, both
    /// set to it (Marlin's Fig. 8), instead of the usual rows.
    #[arg(long, value_delimiter = ',')]
    mtu: Vec<usize>,
    /// Patterns: pingpong, oneway, twoway, rate, table1, pieces (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "pingpong,oneway")]
    pattern: Vec<String>,
    /// Sizes, suffixes K and M (comma-separated) [default: 8,64,4K,64K,1M,4M; with `coll`:
    /// 8,64,1K,8K,64K,1M].
    #[arg(long, value_delimiter = ',')]
    size: Option<Vec<String>>,
    /// Add memcpy rows for the same sizes (the physical limit), measured in the same run.
    #[arg(long)]
    with_limit: bool,
    /// With `vnic`: give each host of the benchmark's rack a core of its own, as real hosts
    /// have (its agent, the tools' ends and the relay's and tunnel's threads in it run there).
    #[arg(long)]
    host_cores: bool,
    /// With `vnic`: only the rows whose names start with one of these (comma-separated; e.g.
    /// `xrack` for the cross-rack rows) [default: every row].
    #[arg(long, value_delimiter = ',')]
    rows: Vec<String>,
    /// Add peer rows (UCX over shared memory, from ucx_perftest) where installed.
    #[arg(long)]
    peers: bool,
    /// Copy channels for large batches.
    #[arg(long, default_value_t = 2)]
    copy_channels: usize,
    /// Iteration budget scale (1.0 full; smaller is quicker and noisier).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Print one JSON document with a `rows` array instead of a table.
    #[arg(long)]
    json: bool,
}

/// The one frame size `--mtu` gives outside `bench vnic` (none: the default).
fn one_mtu(mtu: &[usize]) -> Result<Option<usize>> {
    match mtu {
        [] => Ok(None),
        [m] => Ok(Some(*m)),
        _ => bail!("--mtu takes one value here (a list goes with `bench vnic`)"),
    }
}

fn init_logging(default: tracing::Level) {
    let level = match std::env::var("RUST_LOG").ok().as_deref().map(str::to_ascii_lowercase).as_deref() {
        Some("error") => tracing::Level::ERROR,
        Some("warn") => tracing::Level::WARN,
        Some("info") => tracing::Level::INFO,
        Some("debug") => tracing::Level::DEBUG,
        Some("trace") => tracing::Level::TRACE,
        _ => default,
    };
    let fmt = tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::stderr);
    if LOG_JSON.load(std::sync::atomic::Ordering::Relaxed) {
        fmt.json().init();
    } else {
        fmt.init();
    }
}

pub(crate) fn read_secret(file: &Option<PathBuf>) -> Result<Vec<u8>> {
    if let Some(p) = file {
        return Ok(rackwire::read_secret_file(p)?);
    }
    if let Some(p) = std::env::var_os(rackwire::vars::SECRET_FILE) {
        return read_secret(&Some(PathBuf::from(p)));
    }
    if let Ok(s) = std::env::var(rackwire::vars::SECRET) {
        return Ok(s.into_bytes());
    }
    bail!("no fabric secret: pass --secret-file, or set RACKWIRE_SECRET_FILE or RACKWIRE_SECRET")
}

impl BenchArgs {
    fn sizes(&self, default: &str) -> Result<Vec<u64>> {
        let given: Vec<String> = match &self.size {
            Some(v) => v.clone(),
            None => default.split(',').map(String::from).collect(),
        };
        given.iter().map(|s| parse_size(s)).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)
    }

    fn to_bench(&self) -> Result<ShmBench> {
        let patterns = self
            .pattern
            .iter()
            .map(|p| p.parse::<Pattern>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(anyhow::Error::msg)?;
        let sizes = self.sizes("8,64,4K,64K,1M,4M")?;
        if !(1..=rackwire::COPY_CHANNELS_MAX).contains(&self.copy_channels) {
            bail!("--copy-channels must be 1..={}", rackwire::COPY_CHANNELS_MAX);
        }
        if !(self.scale > 0.0 && self.scale <= 10.0) {
            bail!("--scale must be in (0, 10]");
        }
        let transport = match self.transport.as_str() {
            "udp" | "udp-unsealed" => {
                if !(1..=8).contains(&self.links) {
                    bail!("--links must be 1..=8");
                }
                let mtu = one_mtu(&self.mtu)?.unwrap_or(65000);
                if !(256..=65507).contains(&mtu) {
                    bail!("--mtu must be 256..=65507");
                }
                let sealed = self.transport == "udp";
                rackwire_bench::BenchTransport::Udp { links: self.links, mtu, sealed }
            }
            "rails" => rackwire_bench::BenchTransport::Rails,
            _ => rackwire_bench::BenchTransport::Shm,
        };
        Ok(ShmBench {
            transport,
            patterns,
            sizes,
            with_limit: self.with_limit,
            peers: self.peers,
            scale: self.scale,
            progress: !self.json,
            responder_exe: None,
            copy_channels: self.copy_channels,
        })
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Mh(args) => {
            init_logging(tracing::Level::INFO);
            mh_cmd::run(args)
        }
        Cmd::PackageFiles { dir } => {
            for p in package_files::write(&dir)? {
                println!("{}", p.display());
            }
            Ok(())
        }
        Cmd::Config { what: ConfigCmd::Reference } => {
            print!("{}", rackwire::config_reference());
            Ok(())
        }
        Cmd::Config { what: ConfigCmd::Check { file } } => {
            let path =
                file.or_else(rackwire::config_path).unwrap_or_else(|| PathBuf::from(rackwire::CONFIG_PATH_DEFAULT));
            match rackwire::FabricConfig::check_file(&path) {
                Ok(()) => {
                    println!("{}: ok", path.display());
                    Ok(())
                }
                Err(problems) => {
                    for p in &problems {
                        println!("{p}");
                    }
                    bail!("{} problem(s) in {}", problems.len(), path.display())
                }
            }
        }
        Cmd::Doctor { config, json, offline } => {
            init_logging(tracing::Level::ERROR);
            if !doctor::run(config, json, offline)? {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Nodes { fabric, json } => {
            init_logging(tracing::Level::WARN);
            inspect::nodes(&fabric, json)
        }
        Cmd::Regions { fabric, json } => {
            init_logging(tracing::Level::WARN);
            inspect::regions(&fabric, json)
        }
        Cmd::Bench(b) if (b.host_cores || !b.rows.is_empty()) && b.suite.as_deref() != Some("vnic") => {
            bail!("--host-cores and --rows go with `bench vnic` (a rack of your own takes `cores = [..]` per host)")
        }
        Cmd::Bench(b) if b.suite.as_deref() == Some("vnic") => {
            init_logging(tracing::Level::WARN);
            if !(b.scale > 0.0 && b.scale <= 10.0) {
                bail!("--scale must be in (0, 10]");
            }
            if !b.mtu.is_empty() {
                if !b.rows.is_empty() {
                    bail!("--mtu measures its own rows: leave out --rows");
                }
                return rackwire_bench::vnic_mtu::run(&b.mtu, b.repeat, b.scale, b.host_cores, b.json);
            }
            rackwire_bench::vnic::run(&rackwire_bench::vnic::VnicBench {
                json: b.json,
                scale: b.scale,
                repeat: b.repeat,
                host_cores: b.host_cores,
                rows: b.rows.clone(),
            })
        }
        Cmd::Bench(b) if b.suite.is_none() && b.rack.is_some() => {
            init_logging(tracing::Level::WARN);
            if b.transport != "shm" || b.peers {
                bail!(
                    "--rack runs the edge transport over the rack's rails, without peers (no --transport, no --peers)"
                );
            }
            let patterns = if b.pattern == ["pingpong", "oneway"] {
                rackwire_bench::rails::PATTERNS_DEFAULT.to_string()
            } else {
                b.pattern.join(",")
            };
            let sizes =
                b.size.as_ref().map(|s| s.join(",")).unwrap_or_else(|| rackwire_bench::rails::SIZES_DEFAULT.into());
            let args = [
                "--pattern".to_string(),
                patterns,
                "--size".into(),
                sizes,
                "--scale".into(),
                b.scale.to_string(),
                "--repeat".into(),
                b.repeat.to_string(),
                "--copy-channels".into(),
                b.copy_channels.to_string(),
            ];
            rackwire_bench::rails::run(b.rack.as_deref().expect("matched"), &args, b.json)
        }
        Cmd::Bench(b) if b.suite.as_deref() == Some("stripe") => {
            init_logging(tracing::Level::WARN);
            let Some(config) = &b.config else { bail!("bench stripe needs --config RACK.toml (see examples/racks/)") };
            rackwire_bench::stripe::run(config, b.mib, b.repeat, b.json, b.scale)
        }
        Cmd::Bench(b) if b.suite.as_deref() == Some("coll") => {
            init_logging(tracing::Level::WARN);
            if !(b.scale > 0.0 && b.scale <= 10.0) {
                bail!("--scale must be in (0, 10]");
            }
            rackwire_bench::coll::run(&rackwire_bench::coll::CollBench {
                ranks: b.ranks.clone(),
                ops: b.op.clone(),
                sizes: b.sizes(rackwire_bench::coll::SIZES_DEFAULT)?,
                peers: b.peers,
                edge: b.transport == "udp",
                rack: b.rack.clone(),
                scale: b.scale,
                repeat: b.repeat,
                json: b.json,
            })
        }
        Cmd::Bench(b) if b.suite.as_deref() == Some("seal") => {
            init_logging(tracing::Level::WARN);
            if !(b.scale > 0.0 && b.scale <= 10.0) {
                bail!("--scale must be in (0, 10]");
            }
            let mtu = one_mtu(&b.mtu)?.unwrap_or(rackwire_bench::seal::MTU_DEFAULT);
            rackwire_bench::seal::run(mtu, b.repeat, b.scale, b.json)
        }
        Cmd::Bench(b) if b.suite.as_deref() == Some("mpi") => {
            init_logging(tracing::Level::WARN);
            if !(b.scale > 0.0 && b.scale <= 10.0) {
                bail!("--scale must be in (0, 10]");
            }
            rackwire_bench::mpi::run(b.repeat, b.scale, b.json, b.rack.as_deref())
        }
        Cmd::Bench(b) if b.suite.as_deref() == Some("ofi") => {
            init_logging(tracing::Level::WARN);
            if !(b.scale > 0.0 && b.scale <= 10.0) {
                bail!("--scale must be in (0, 10]");
            }
            rackwire_bench::ofi::run(b.repeat, b.scale, b.json, b.rack.as_deref())
        }
        Cmd::Bench(b) if b.suite.as_deref() == Some("served") => {
            init_logging(tracing::Level::WARN);
            if !(b.scale > 0.0 && b.scale <= 10.0) {
                bail!("--scale must be in (0, 10]");
            }
            rackwire_bench::served::run(b.repeat, b.scale, b.json)
        }
        Cmd::Bench(b) if b.suite.as_deref() == Some("lang") => {
            init_logging(tracing::Level::WARN);
            if !(b.scale > 0.0 && b.scale <= 10.0) {
                bail!("--scale must be in (0, 10]");
            }
            let pp = ((20_000.0 * b.scale) as u64).max(10);
            let bw = ((2_000.0 * b.scale) as u64).max(10);
            rackwire_bench::lang::run(pp, bw, b.repeat, b.json)
        }
        Cmd::SendRaw { fabric, name, to, hex } => {
            init_logging(tracing::Level::WARN);
            let bytes = rackwire_mh::auth::from_hex(&hex).context("--hex: not hex")?;
            let mut cfg = fabric.resolve(&name)?;
            cfg.name = name;
            let f = rackwire::Fabric::join(cfg)?;
            f.connect_name(&to)?.send(&bytes).wait()?;
            Ok(())
        }
        Cmd::LangWorker { role, iters } => {
            init_logging(tracing::Level::WARN);
            rackwire_bench::lang::worker(&role, iters)
        }
        Cmd::CollWorker { op, size, scale } => {
            init_logging(tracing::Level::WARN);
            let sizes = size.split(',').map(parse_size).collect::<Result<Vec<_>, _>>().map_err(anyhow::Error::msg)?;
            rackwire_bench::coll::worker(&op, &sizes, scale)
        }
        Cmd::Eval(e) => {
            init_logging(tracing::Level::WARN);
            rackwire_eval::command::run(&e)
        }
        Cmd::EvalWorker(w) => {
            init_logging(tracing::Level::WARN);
            rackwire_eval::command::worker(&w)
        }
        Cmd::StripeWorker { role, bytes } => {
            init_logging(tracing::Level::WARN);
            rackwire_bench::stripe::worker(&role, bytes)
        }
        Cmd::Bench(b) => {
            init_logging(tracing::Level::WARN);
            let cfg = b.to_bench()?;
            if !(1..=BENCH_REPEAT_MAX).contains(&b.repeat) {
                bail!("--repeat must be 1..={BENCH_REPEAT_MAX}");
            }
            let mut runs = Vec::with_capacity(b.repeat);
            for _ in 0..b.repeat {
                runs.push(rackwire_bench::run_shm(&cfg)?);
            }
            let mut report =
                if b.repeat == 1 { runs.pop().expect("one run") } else { rackwire_bench::repeat::combine(runs) };
            report.meta.insert("command".into(), std::env::args().collect::<Vec<_>>().join(" ").into());
            if b.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!("{}", print_table(&report));
            }
            Ok(())
        }
        Cmd::Launch(l) => {
            init_logging(tracing::Level::WARN);
            let code = launch::run(&l)?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        Cmd::Demo(d) => {
            init_logging(tracing::Level::WARN);
            demo::run(&d)
        }
        Cmd::Sim(a) => {
            init_logging(tracing::Level::WARN);
            sim::run(&a)
        }
        Cmd::Rack(r) => {
            init_logging(tracing::Level::WARN);
            let code = rack::run(r)?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        Cmd::Agent { fabric, agent } => {
            init_logging(tracing::Level::INFO);
            rack::agent(agent, &fabric)
        }
        Cmd::BenchResponder => {
            init_logging(tracing::Level::WARN);
            rackwire_bench::responder_main()
        }
        Cmd::DemoWorker => {
            init_logging(tracing::Level::WARN);
            demo::worker()
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    LOG_JSON.store(cli.log_format == "json", std::sync::atomic::Ordering::Relaxed);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rackwire: {e:#}");
            ExitCode::FAILURE
        }
    }
}
