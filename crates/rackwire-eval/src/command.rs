//! `rackwire eval`: the evaluation the arguments ask for — one workload's table, the energy
//! tables ([`crate::energy_tables`]), or everything with its report ([`crate::report`]).

use anyhow::Result;
use serde_json::json;

use crate::runs::{measure_rows, rack_once, table_of, EvalArgs, WorkerArgs};

/// `rackwire eval WORKLOAD`.
pub fn run(a: &EvalArgs) -> Result<()> {
    // A rack described by a file is brought up once for every job of the run (and taken
    // down at the end), not once per job.
    let (a, _rack) = rack_once(a)?;
    let a = &a;
    if a.workload == "energy" {
        return crate::energy_tables::run(a);
    }
    if a.workload == "dsm" {
        return crate::dsm_runs::run(a);
    }
    if a.workload == "all" {
        return crate::report::run(a);
    }
    let rows = measure_rows(a)?;
    let pairs = crate::runs::tcp_pairs_note(a)?;
    let cores = crate::runs::cores_note_of(a)?;
    if a.json {
        let meta =
            json!({ "command": std::env::args().collect::<Vec<_>>().join(" "), "tcp_pairs": pairs, "cores": cores });
        println!("{}", serde_json::to_string_pretty(&json!({ "meta": meta, "rows": rows }))?);
    } else {
        println!("{}", table_of(&rows));
        println!("(speedup: TCP's time over this path's, same job and data, median of the repeats with their spread; J: an estimate from the energy model, see `rackwire eval energy`)");
        println!("({pairs}; {cores})");
    }
    Ok(())
}

/// `rackwire eval-worker`: one rank of a workload's job.
pub fn worker(w: &WorkerArgs) -> Result<()> {
    if w.workload == "dsm" {
        let g = rackwire_coll::Group::from_env()?;
        return crate::dsm_runs::worker(
            g,
            &w.net,
            w.variant.as_deref().unwrap_or("lu"),
            w.records as usize,
            w.seed,
            &w.dir,
        );
    }
    crate::runs::worker(w)
}
