//! The RMA micro-benchmarks between two hosts of a virtual rack, over their shaped rails
//! (MultiEdge's Fig. 2 on 1L-1G, 2L-1G, 1L-10G): the initiator runs in the first host with
//! that host's fabric settings in its environment (the rack's management host and secret, the
//! host's links), and starts the responder in the second host with the second host's links.
//! The caller (`rackwire bench --rack`) brings the rack up and starts the initiator there.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use rackwire::FabricConfig;

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
