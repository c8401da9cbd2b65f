//! Starting this program again as a worker: the hidden subcommands a benchmark, the evaluation
//! or the demo runs in processes of their own, and the commands that start them (a worker
//! alone on the fabric of the caller's management host, or a job of workers through
//! `rackwire launch`). The `rackwire` binary names its hidden subcommands with these.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

/// The responder of the RMA micro-benchmarks.
pub const RESPONDER: &str = "bench-responder";
/// One rank of `bench coll`'s job.
pub const COLL_WORKER: &str = "coll-worker";
/// One end of `bench stripe`.
pub const STRIPE_WORKER: &str = "stripe-worker";
/// The Rust side of `bench lang`.
pub const LANG_WORKER: &str = "lang-worker";
/// One rank of an evaluation workload's job.
pub const EVAL_WORKER: &str = "eval-worker";
/// One worker of `rackwire demo`.
pub const DEMO_WORKER: &str = "demo-worker";

/// This program's own executable.
pub fn own_exe() -> Result<PathBuf> {
    std::env::current_exe().context("own executable")
}

/// This program as the worker `subcommand` (its arguments and environment to be added).
pub fn worker(subcommand: &str) -> Result<Command> {
    let mut c = Command::new(own_exe()?);
    c.arg(subcommand);
    Ok(c)
}

/// `c` on the fabric of the management host at `mh` with `secret`, named `name` (none: a
/// transient node), whatever this process's own settings are (its secret file and
/// configuration file are not passed on).
pub fn on_fabric<'a>(c: &'a mut Command, mh: &str, secret: &str, name: Option<&str>) -> &'a mut Command {
    c.env(rackwire::vars::MH, mh)
        .env(rackwire::vars::SECRET, secret)
        .env_remove(rackwire::vars::SECRET_FILE)
        .env_remove(rackwire::vars::CONFIG);
    match name {
        Some(n) => c.env(rackwire::vars::NAME, n),
        None => c.env_remove(rackwire::vars::NAME),
    }
}

/// The rack `rack` names, brought up with this program as its agents if it is a description
/// (see [`rackwire_rack::place::up_or_load`]).
pub fn rack_up(rack: &Path, no_vnic: bool) -> Result<(rackwire_rack::RackState, Option<rackwire_rack::DownOnDrop>)> {
    Ok(rackwire_rack::place::up_or_load(rack, no_vnic, &own_exe()?)?)
}

/// A job of `ranks` ranks of this program's worker `subcommand` (its arguments to be added),
/// started by `rackwire launch` with its output unprefixed, on this machine or over the hosts
/// of the virtual rack `rack`; the job brings its own management host up (none is passed on).
pub fn job(ranks: usize, rack: Option<&Path>, subcommand: &str) -> Result<Command> {
    let exe = own_exe()?;
    let mut c = Command::new(&exe);
    c.args(["launch", "--no-prefix", "-n", &ranks.to_string()]);
    if let Some(rack) = rack {
        c.arg("--rack").arg(rack);
    }
    c.arg("--").arg(&exe).arg(subcommand).env_remove(rackwire::vars::MH);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the command lines and environments the helpers build (nothing is started): a job
    // runs `launch` with the rank count, the rack and the worker after `--`, and drops the
    // management host's address; a worker on a fabric gets the address, secret and name and
    // loses this process's secret file and configuration.
    #[test]
    fn commands_carry_their_arguments_and_environment() {
        let j = job(3, Some(Path::new("rack.toml")), COLL_WORKER).unwrap();
        let args: Vec<_> = j.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        let exe = own_exe().unwrap().to_string_lossy().into_owned();
        assert_eq!(args, ["launch", "--no-prefix", "-n", "3", "--rack", "rack.toml", "--", exe.as_str(), COLL_WORKER]);
        let env = |c: &Command, k: &str| c.get_envs().find(|(n, _)| *n == k).map(|(_, v)| v.map(|v| v.to_owned()));
        assert_eq!(env(&j, rackwire::vars::MH), Some(None), "the address is removed");
        let mut w = worker(DEMO_WORKER).unwrap();
        on_fabric(&mut w, "127.0.0.1:1", "s3cret", Some("w1"));
        assert_eq!(w.get_args().collect::<Vec<_>>(), [DEMO_WORKER]);
        assert_eq!(env(&w, rackwire::vars::MH), Some(Some("127.0.0.1:1".into())));
        assert_eq!(env(&w, rackwire::vars::NAME), Some(Some("w1".into())));
        assert_eq!(env(&w, rackwire::vars::CONFIG), Some(None));
        assert_eq!(env(&w, rackwire::vars::SECRET_FILE), Some(None));
    }
}
