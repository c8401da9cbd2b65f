//! `rackwire eval all --report DIR`: everything the evaluation measures, in one report with
//! pictures: the micro-benchmarks against memcpy and UCX, the collectives against Open MPI,
//! the workloads over the fabric and TCP, and the energy tables.

use anyhow::{Context, Result};
use rackwire_bench::{markdown, Pattern, Report, ShmBench};

use crate::runs::EvalArgs;

/// Sizes of the micro-benchmark sweeps.
const MICRO_SIZES: [u64; 7] = [8, 64, 512, 4096, 65536, 1 << 20, 4 << 20];
/// Rank counts of the collectives.
const COLL_RANKS: [usize; 2] = [2, 4];

/// `rackwire eval all`: every table and figure into the report folder.
pub fn run(a: &EvalArgs) -> Result<()> {
    crate::runs::check(a)?;
    let dir = &a.report;
    std::fs::create_dir_all(dir).with_context(|| format!("report folder {}", dir.display()))?;
    let mut md = String::from("# rackwire evaluation report\n\n");
    md.push_str(&format!(
        "Command: `{}`. Every ratio compares figures measured in this same run. Energy figures are estimates from the model, not measurements.\n\n",
        std::env::args().collect::<Vec<_>>().join(" ")
    ));

    eprintln!("== micro-benchmarks (shared memory; memcpy and UCX in the same run) ==");
    let scale = (0.3 * a.scale).clamp(0.02, 1.0);
    let base = ShmBench { with_limit: true, peers: !a.no_peers, scale, progress: !a.json, ..ShmBench::default() };
    let mut micro = Report::default();
    for p in [Pattern::Pingpong, Pattern::Oneway] {
        micro.merge(rackwire_bench::run_shm(&ShmBench {
            patterns: vec![p],
            sizes: MICRO_SIZES.to_vec(),
            ..base.clone()
        })?);
    }
    md.push_str("## Micro-benchmarks (OSU Figs. 2–3)\n\n");
    md.push_str(&crate::figures::micro(&micro, dir)?);
    md.push_str(&markdown(&micro));

    eprintln!("== collectives (jobs of {COLL_RANKS:?} ranks; Open MPI in the same run) ==");
    let coll = rackwire_bench::coll::measure(&rackwire_bench::coll::CollBench {
        ranks: COLL_RANKS.to_vec(),
        ops: rackwire_bench::coll::OPS.map(String::from).to_vec(),
        sizes: vec![8, 64, 1024, 8192, 65536, 1 << 20],
        peers: !a.no_peers,
        edge: false,
        rack: None,
        scale,
        repeat: a.repeat,
        json: true,
    })?;
    md.push_str("\n## Collectives (OSU Figs. 4–5)\n\n");
    md.push_str(&crate::figures::collectives(&coll, dir)?);

    eprintln!("== workloads over the fabric and over TCP ==");
    let mut rows = Vec::new();
    for w in ["sort", "grep", "dfsio", "kv"] {
        let mut wa = a.clone();
        wa.workload = w.into();
        rows.extend(crate::runs::measure_rows(&wa)?);
    }
    md.push_str("\n## Workloads: the fabric against TCP (HP Figs. 2–3, OSU Figs. 6–8)\n\n");
    md.push_str(&crate::figures::workloads(&rows, dir)?);
    md.push_str(&format!("```text\n{}\n```\n", crate::runs::table_of(&rows)));
    md.push_str(&format!("\n{}; {}.\n", crate::runs::tcp_pairs_note(a)?, crate::runs::cores_note_of(a)?));

    eprintln!("== energy tables (sort and grep at each core count) ==");
    let (energy, text) = crate::energy_tables::tables(a)?;
    md.push_str("\n## Energy efficiency (HP Tables 2–3, Marlin Table 3; estimates)\n\n");
    md.push_str(&format!("```text\n{text}\n```\n"));

    std::fs::write(dir.join("report.md"), &md)?;
    let doc = serde_json::json!({ "micro": micro, "collectives": coll, "workloads": rows, "energy": energy });
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(&doc)?)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{}", crate::runs::table_of(&rows));
        println!("{text}");
        println!("report written to {}/ (report.md, results.json, pictures)", dir.display());
    }
    Ok(())
}
