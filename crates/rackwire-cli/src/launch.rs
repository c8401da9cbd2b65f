//! `rackwire launch`: start the N ranks of a job on this machine, or over the hosts of a
//! virtual rack, as mpirun does.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use rackwire_rack::place::{block_place, rank_hosts};

/// The most ranks one launch starts (as many as a group may have).
pub(crate) const LAUNCH_RANKS_MAX: usize = rackwire_coll::RANKS_MAX;
/// How often the launcher looks at its ranks.
const REAP_EVERY: Duration = Duration::from_millis(5);
/// How long the launcher waits, once the ranks are gone, for their last output lines.
const OUTPUT_DRAIN_MAX: Duration = Duration::from_secs(2);
/// How long ranks have, once asked to stop (SIGTERM), before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(2);

#[derive(Args)]
pub(crate) struct LaunchArgs {
    /// Ranks to start.
    #[arg(short = 'n', long = "np")]
    ranks: usize,
    /// The job's name (default: one of its own, unique on this machine).
    #[arg(long)]
    job: Option<String>,
    /// Do not prefix output lines with the rank.
    #[arg(long)]
    no_prefix: bool,
    /// Spread the ranks over the local hosts of a virtual rack (root), in blocks (ranks 0..k
    /// on the first host, and so on): a rack description, brought up for the job and taken
    /// down after, or the name of a rack that is up. Ranks of one memory domain use shared
    /// memory, the others the edge transport over the rack's rails.
    #[arg(long, value_name = "CONFIG|NAME")]
    rack: Option<std::path::PathBuf>,
    /// The program and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    program: Vec<String>,
}

/// Exit status of the job: the first failing rank's (128 + signal for a signal), else 0.
fn code_of(s: ExitStatus) -> i32 {
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

fn pipe_lines(
    rank: usize,
    prefix: bool,
    from: impl std::io::Read + Send + 'static,
    to_err: bool,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            let mut out: Box<dyn Write> =
                if to_err { Box::new(std::io::stderr().lock()) } else { Box::new(std::io::stdout().lock()) };
            if prefix {
                let _ = write!(out, "[{rank}] ");
            }
            let _ = out.write_all(&line);
        }
    })
}

/// Wait until every rank's output is forwarded (each forwarder ends when its pipe does, at
/// the rank's exit), but not past [`OUTPUT_DRAIN_MAX`]: a rank's own children may hold its
/// pipe open for longer.
fn drain_output(forwarders: Vec<std::thread::JoinHandle<()>>) {
    let deadline = std::time::Instant::now() + OUTPUT_DRAIN_MAX;
    for f in forwarders {
        while !f.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if f.is_finished() {
            let _ = f.join();
        }
    }
}

fn stop_all(children: &mut [(usize, Child)]) {
    for (_, c) in children.iter() {
        // Asked first, so a rank can leave cleanly; killed after the grace period.
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(c.id() as i32).expect("a child's pid is positive"),
            rustix::process::Signal::TERM,
        );
    }
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline && children.iter_mut().any(|(_, c)| matches!(c.try_wait(), Ok(None))) {
        std::thread::sleep(REAP_EVERY);
    }
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Where one rank runs: a rack host's namespace (none: here), its rank among the ranks of
/// that host, and the environment that host gives its programs.
pub(crate) struct Place {
    pub ns: Option<String>,
    pub local_rank: usize,
    pub env: Vec<(String, String)>,
    /// Its host's cores (empty: any).
    pub cores: Vec<usize>,
}

/// Place `ranks` ranks over the local hosts of the rack `rack` names (see
/// [`rackwire_bench::spawn::rack_up`]).
fn rack_places(rack: &std::path::Path, ranks: usize) -> Result<(Vec<Place>, Option<rackwire_rack::DownOnDrop>)> {
    let (state, down) = rackwire_bench::spawn::rack_up(rack, false)?;
    let hosts = rank_hosts(&state);
    let places = (0..ranks)
        .map(|rank| {
            let (h, local_rank) = block_place(rank, ranks, hosts.len());
            Place {
                ns: Some(hosts[h].ns.clone()),
                local_rank,
                env: rackwire_rack::program_env(&state, hosts[h]),
                cores: hosts[h].cores.clone(),
            }
        })
        .collect();
    Ok((places, down))
}

/// Start the job and wait for it; returns the exit code for the launcher.
pub(crate) fn run(a: &LaunchArgs) -> Result<i32> {
    if !(1..=LAUNCH_RANKS_MAX).contains(&a.ranks) {
        bail!("-n must be 1..={LAUNCH_RANKS_MAX}");
    }
    let job = a.job.clone().unwrap_or_else(|| format!("job-{}", std::process::id()));
    rackwire_mh::check_name(&job).map_err(|e| anyhow::anyhow!("--job: {e}"))?;
    let (places, _rack) = match &a.rack {
        Some(rack) => rack_places(rack, a.ranks)?,
        None => (
            (0..a.ranks).map(|r| Place { ns: None, local_rank: r, env: Vec::new(), cores: Vec::new() }).collect(),
            None,
        ),
    };
    // A management host of our own unless one is given, by the environment or the host's
    // configuration file (a rack has its own).
    let mut env: Vec<(String, String)> = Vec::new();
    let given = || rackwire::FabricConfig::from_env().map(|c| !c.mh.is_empty());
    let _mh = if a.rack.is_some() || given()? {
        None
    } else {
        let secret = format!("{:032x}{:032x}", rackwire_mh::auth::random_u128(), rackwire_mh::auth::random_u128());
        let mh = rackwire::ManagementHost::start("127.0.0.1:0", None, secret.as_bytes())
            .context("starting the job's management host")?;
        env.push((rackwire::vars::MH.into(), mh.addr().to_string()));
        env.push((rackwire::vars::SECRET.into(), secret));
        Some(mh)
    };
    // The job's token: only its ranks hold it, so nobody else on the fabric can take a rank,
    // reset the job, or take its ranks' names first (see `rackwire_mh::jobs`).
    let token = format!("{:032x}", rackwire_mh::auth::random_u128());
    env.push((rackwire::vars::JOB_TOKEN.into(), token));
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("signal handler")?;
    }
    let mut children = Vec::with_capacity(a.ranks);
    let mut forwarders = Vec::with_capacity(2 * a.ranks);
    for (rank, place) in places.iter().enumerate() {
        let mut cmd = match &place.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&a.program[0]);
                c
            }
            None => Command::new(&a.program[0]),
        };
        cmd.args(&a.program[1..])
            .envs(env.iter().chain(&place.env).map(|(k, v)| (k, v)))
            .env(rackwire::vars::RANK, rank.to_string())
            .env(rackwire::vars::SIZE, a.ranks.to_string())
            .env(rackwire::vars::LOCAL_RANK, place.local_rank.to_string())
            .env(rackwire::vars::JOB, &job)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // On its host's cores, if the rack gives it some.
        let mut child = match rackwire_rack::cores::on_cores(&place.cores, || cmd.spawn()).and_then(|r| r) {
            Ok(c) => c,
            Err(e) => {
                stop_all(&mut children);
                bail!("starting rank {rank} ({}): {e}", a.program[0]);
            }
        };
        let prefix = !a.no_prefix;
        if let Some(o) = child.stdout.take() {
            forwarders.push(pipe_lines(rank, prefix, o, false));
        }
        if let Some(e) = child.stderr.take() {
            forwarders.push(pipe_lines(rank, prefix, e, true));
        }
        children.push((rank, child));
    }
    let mut running = a.ranks;
    let mut first_failure: Option<(usize, ExitStatus)> = None;
    while running > 0 {
        if stop.load(Ordering::Relaxed) {
            eprintln!("rackwire launch: stopping the job");
            stop_all(&mut children);
            drain_output(forwarders);
            return Ok(130);
        }
        let mut exited = Vec::new();
        for (i, (rank, c)) in children.iter_mut().enumerate() {
            if let Ok(Some(s)) = c.try_wait() {
                exited.push((i, *rank, s));
            }
        }
        for &(i, rank, s) in exited.iter().rev() {
            children.swap_remove(i);
            running -= 1;
            if !s.success() && first_failure.is_none() {
                first_failure = Some((rank, s));
            }
        }
        if let Some((rank, s)) = first_failure {
            if running > 0 {
                eprintln!("rackwire launch: rank {rank} failed ({s}); stopping the other ranks");
                stop_all(&mut children);
            }
            drain_output(forwarders);
            return Ok(code_of(s));
        }
        std::thread::sleep(REAP_EVERY);
    }
    drain_output(forwarders);
    Ok(0)
}
