//! `rackwire bench --rack CONFIG`: the RMA micro-benchmarks (ping-pong, one-way, two-way, by
//! default over MultiEdge's sizes) between the first two hosts of a virtual rack, over its
//! shaped rails: MultiEdge's Fig. 2 on 1L-1G, 2L-1G and 1L-10G. Each host runs on cores of its
//! own, as real hosts do: the rack's `cores` where it gives them, else the first host on core
//! 0 and the second on core 1 (where the machine has two). Waiting threads poll as the library
//! does by default (`RACKWIRE_BUSY_POLL_US` sets it; 0: they sleep at once). The rows' CPU is
//! the initiator's process, its network thread included. The rails' nominal rate is the
//! throughput's limit, printed with them.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use rackwire_bench::rails::{RESPONDER_CORES_VAR, RESPONDER_DOMAIN_VAR, RESPONDER_LINKS_VAR, RESPONDER_NS_VAR};
use rackwire_rack::{rate_bytes_per_s, RackConfig};

/// The patterns MultiEdge's Fig. 2 has, when none are given.
pub(crate) const PATTERNS_DEFAULT: &str = "pingpong,oneway,twoway";
/// Its sizes (64 B to 1 MiB), when none are given.
pub(crate) const SIZES_DEFAULT: &str = "64,1K,16K,64K,1M";

/// `cores` as taskset takes them.
fn core_list(cores: &[usize]) -> String {
    cores.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

/// Run the benchmark with `args` (the same `bench` arguments, less the rack) in the rack that
/// `rack` describes: the initiator in its first host, the responder in its second.
pub(crate) fn run(rack: &Path, args: &[String], json: bool) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("--rack runs the benchmark in a virtual rack: it needs root");
    }
    let text = std::fs::read_to_string(rack).with_context(|| format!("rack config {}", rack.display()))?;
    let mut cfg = RackConfig::parse(&text)?;
    let nominal: u64 = cfg.rails.iter().filter_map(|r| r.rate.as_deref().and_then(rate_bytes_per_s)).sum();
    let (state, _down) = rackwire_rack::place::two_machines_up(&mut cfg, &std::env::current_exe()?)?;
    let hosts = rackwire_rack::place::rank_hosts(&state);
    let (first, second) = (hosts[0], hosts[1]);
    // A core each, where the rack does not say and the machine has two.
    let two = std::thread::available_parallelism().map(|n| n.get() >= 2).unwrap_or(false);
    let own = |h: &rackwire_rack::HostState, core: usize| match (h.cores.is_empty(), two) {
        (true, true) => vec![core],
        _ => h.cores.clone(),
    };
    let (first_cores, second_cores) = (own(first, 0), own(second, 1));
    let exe = std::env::current_exe().context("own executable")?;
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
