//! The RMA micro-benchmarks between two hosts of a virtual rack, over their shaped rails
//! (MultiEdge's Fig. 2 on 1L-1G, 2L-1G, 1L-10G): the initiator runs in the first host with
//! that host's fabric settings in its environment (the rack's management host and secret, the
//! host's links), and starts the responder in the second host with the second host's links.
//! [`run`] (`rackwire bench --rack`) brings the rack up and starts the initiator there, each
//! host on cores of its own (the rack's `cores`, else the first host on core 0 and the second
//! on core 1 where the machine has two). Waiting threads poll as the library does by default;
//! the rows' CPU is the initiator's process, its network thread included; the rails' nominal
//! rate is the throughput's limit, printed with them.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use rackwire::FabricConfig;
use rackwire_rack::{rate_bytes_per_s, RackConfig};

/// The second host's network namespace, where the responder runs.
pub const RESPONDER_NS_VAR: &str = "RW_BENCH_RESPONDER_NS";
/// The second host's links.
pub const RESPONDER_LINKS_VAR: &str = "RW_BENCH_RESPONDER_LINKS";
/// The second host's memory domain.
pub const RESPONDER_DOMAIN_VAR: &str = "RW_BENCH_RESPONDER_DOMAIN";
/// The second host's cores (comma-separated; empty: any).
pub const RESPONDER_CORES_VAR: &str = "RW_BENCH_RESPONDER_CORES";

/// A node's configuration from the environment a rack's host gives its programs (its links,
/// the rack's management host and secret), on the edge transport.
pub(crate) fn config(name: &str) -> Result<FabricConfig> {
    let mut c = FabricConfig::from_env().context("the host's fabric settings (RACKWIRE_MH, RACKWIRE_LINKS, ...)")?;
    c.name = name.to_string();
    c.transport = rackwire::TransportChoice::Edge;
    if c.links.is_empty() {
        anyhow::bail!("{} is empty: the rails benchmark runs in a rack's host", rackwire::vars::LINKS);
    }
    Ok(c)
}

/// The command that starts `exe`'s `subcommand` in the second host, with its links and
/// memory domain (the rest of the environment, the rack's management host and secret among
/// it, is this process's), on the second host's cores where the rack gives it some.
pub(crate) fn responder_command(exe: &Path, subcommand: &str) -> Result<Command> {
    let var = |k: &str| std::env::var(k).with_context(|| format!("{k} not set (started by `rackwire bench --rack`)"));
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &var(RESPONDER_NS_VAR)?]);
    let cores = std::env::var(RESPONDER_CORES_VAR).unwrap_or_default();
    if !cores.is_empty() {
        c.args(["taskset", "-c", &cores]);
    }
    c.arg(exe).arg(subcommand);
    c.env(rackwire::vars::LINKS, var(RESPONDER_LINKS_VAR)?)
        .env(rackwire::vars::MEMORY_DOMAIN, var(RESPONDER_DOMAIN_VAR)?);
    Ok(c)
}

/// The patterns MultiEdge's Fig. 2 has, when none are given.
pub const PATTERNS_DEFAULT: &str = "pingpong,oneway,twoway";
/// Its sizes (64 B to 1 MiB), when none are given.
pub const SIZES_DEFAULT: &str = "64,1K,16K,64K,1M";

/// `cores` as taskset takes them.
fn core_list(cores: &[usize]) -> String {
    cores.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

/// Run the benchmark with `args` (the same `bench` arguments, less the rack) in the rack that
/// `rack` describes: the initiator in its first host, the responder in its second.
pub fn run(rack: &Path, args: &[String], json: bool) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("--rack runs the benchmark in a virtual rack: it needs root");
    }
    let text = std::fs::read_to_string(rack).with_context(|| format!("rack config {}", rack.display()))?;
    let mut cfg = RackConfig::parse(&text)?;
    let nominal: u64 = cfg.rails.iter().filter_map(|r| r.rate.as_deref().and_then(rate_bytes_per_s)).sum();
    let exe = crate::spawn::own_exe()?;
    let (state, _down) = rackwire_rack::place::two_machines_up(&mut cfg, &exe)?;
    let hosts = rackwire_rack::place::rank_hosts(&state);
    let (first, second) = (hosts[0], hosts[1]);
    // A core each, where the rack does not say and the machine has two.
    let two = std::thread::available_parallelism().map(|n| n.get() >= 2).unwrap_or(false);
    let own = |h: &rackwire_rack::HostState, core: usize| match (h.cores.is_empty(), two) {
        (true, true) => vec![core],
        _ => h.cores.clone(),
    };
    let (first_cores, second_cores) = (own(first, 0), own(second, 1));
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &first.ns]);
    if !first_cores.is_empty() {
        c.args(["taskset", "-c", &core_list(&first_cores)]);
    }
    c.arg(&exe).args(["bench", "--transport", "rails"]).args(args);
    if json {
        c.arg("--json");
    }
    c.envs(rackwire_rack::program_env(&state, first))
        .env(rackwire::vars::CONFIG, "")
        .env(RESPONDER_NS_VAR, &second.ns)
        .env(RESPONDER_LINKS_VAR, second.links())
        .env(RESPONDER_DOMAIN_VAR, &second.domain)
        .env(RESPONDER_CORES_VAR, core_list(&second_cores));
    let status = c.status().context("starting the benchmark in the rack's first host")?;
    if !status.success() {
        bail!("the benchmark in the rack's host {} failed ({status})", first.name);
    }
    if !json {
        let rails = cfg.rails.len();
        match nominal {
            0 => println!("(rails not shaped: {rails} at the veths' own rate)"),
            n => println!(
                "(the {rails} rail(s)' nominal rate: {:.0} MB/s one way, {:.0} MB/s two ways; the hosts' cores: {} and {})",
                n as f64 / 1e6,
                2.0 * n as f64 / 1e6,
                if first_cores.is_empty() { "any".into() } else { core_list(&first_cores) },
                if second_cores.is_empty() { "any".into() } else { core_list(&second_cores) },
            ),
        }
    }
    Ok(())
}
