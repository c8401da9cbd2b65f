//! `rackwire eval dsm`'s runs: each application once in one process on plain memory (the
//! reference its shared runs are checked against and timed against), then over the shared
//! memory at 1, 2, 4... ranks up to `--ranks`, a rank per host of the virtual rack; `--repeat`
//! times, alternating, so the speedup of a row is the median of its repeats' own ratios.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use crate::dsm::{run_plain, run_shared, App};
use crate::runs::{job_result, median, print_result, work_dir, EvalArgs};
use crate::RunResult;

/// The rank counts a run measures: 1, 2, 4... below `ranks`, and `ranks`.
pub fn rank_counts(ranks: usize) -> Vec<usize> {
    let mut v: Vec<usize> =
        std::iter::successors(Some(1usize), |n| n.checked_mul(2)).take_while(|&n| n < ranks).collect();
    v.push(ranks.max(1));
    v
}

/// One rank of a `dsm` job: `net` is `plain` (one process on plain memory) or anything else
/// (the shared memory over the fabric).
pub fn worker(g: rackwire_coll::Group, net: &str, app: &str, size: usize, seed: u64, dir: &Path) -> Result<()> {
    let app = App::parse(app)?;
    let rank = g.rank();
    let result = if net == "plain" {
        let r = run_plain(app, size, seed, dir)?;
        g.leave()?;
        r
    } else {
        run_shared(g, app, size, seed, dir)?
    };
    if rank == 0 {
        print_result(&result)?;
    }
    Ok(())
}

fn job(a: &EvalArgs, dir: &Path, app: App, size: usize, ranks: Option<usize>) -> Result<RunResult> {
    // The reference runs on this machine alone; the shared runs over the rack.
    let (n, rack, net) = match ranks {
        None => (1, None, "plain"),
        Some(n) => (n, a.rack.as_deref(), "fabric"),
    };
    let mut cmd = rackwire_bench::spawn::job(n, rack, rackwire_bench::spawn::EVAL_WORKER)?;
    if a.ordered {
        cmd.env(rackwire::vars::IN_ORDER, "on");
    }
    cmd.args(["--workload", "dsm", "--net", net, "--variant", app.name()])
        .args(["--records", &size.to_string(), "--seed", &a.seed.to_string()])
        .arg("--dir")
        .arg(dir);
    job_result(cmd, &format!("{} job ({})", app.name(), ranks.map_or("one process".into(), |n| format!("{n} ranks"))))
}

/// Every application's rows: the one-process reference, then each rank count.
pub fn measure_rows(a: &EvalArgs) -> Result<Vec<serde_json::Value>> {
    crate::runs::check(a)?;
    let dir = work_dir(a)?;
    let rows = measure(a, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

fn measure(a: &EvalArgs, dir: &Path) -> Result<Vec<serde_json::Value>> {
    let counts = rank_counts(a.ranks);
    let line = crate::runs::rails_bytes_per_s(a.rack.as_deref())?;
    let mut rows = Vec::new();
    for name in &a.app {
        let app = App::parse(name)?;
        let size = app.size(a.scale);
        let mut plain = Vec::new();
        let mut shared: Vec<Vec<RunResult>> = vec![Vec::new(); counts.len()];
        for _ in 0..a.repeat {
            // The reference first: each repeat's shared runs are checked against its result.
            plain.push(job(a, dir, app, size, None)?);
            for (i, &n) in counts.iter().enumerate() {
                shared[i]
                    .push(job(a, dir, app, size, Some(n)).with_context(|| format!("{} at {n} ranks", app.name()))?);
            }
        }
        rows.push(row(app, size, &plain, &plain, None));
        for runs in &shared {
            rows.push(row(app, size, runs, &plain, line));
        }
    }
    Ok(rows)
}

/// A row: the median run of `runs`, and its speedup over the one-process runs of the same
/// repeats (the median of the per-repeat ratios, with their spread). With the rails' rate
/// (`line`, bytes/s per host): the time the run's pages and diffs take on the rails, a rank's
/// share of them at the line rate, and the speedup that leaves at most when that time does not
/// overlap the compute (each rank's share of the one-process time).
fn row(app: App, size: usize, runs: &[RunResult], plain: &[RunResult], line: Option<f64>) -> serde_json::Value {
    let mut secs: Vec<f64> = runs.iter().map(|r| r.secs).collect();
    let med = median(&mut secs);
    let run = crate::runs::median_run(runs);
    let mut ratios: Vec<f64> = plain.iter().zip(runs).map(|(p, r)| p.secs / r.secs).collect();
    let speedup = median(&mut ratios);
    let mut row = json!({
        "app": app.name(), "problem": app.describe(size), "size": size, "ranks": run.ranks,
        "transport": run.transport, "secs": med, "secs_lo": secs[0], "secs_hi": secs[secs.len() - 1],
        "repeats": secs.len(), "speedup": speedup, "speedup_lo": ratios[0], "speedup_hi": ratios[ratios.len() - 1],
        "checked": runs.iter().all(|r| r.checked), "cpu_secs": run.cpu_secs,
    });
    if let Some(obj) = row.as_object_mut() {
        for (k, v) in &run.extra {
            obj.insert(k.clone(), json!(v));
        }
        let moved = run.extra.get("fetches").copied().unwrap_or(0.0) * rackwire_dsm::PAGE_BYTES as f64
            + run.extra.get("diff_bytes").copied().unwrap_or(0.0);
        if let Some(rate) = line.filter(|_| run.ranks > 1) {
            let wire = moved / run.ranks as f64 / rate;
            let mut plain_secs: Vec<f64> = plain.iter().map(|r| r.secs).collect();
            let one = median(&mut plain_secs);
            obj.insert("rails_secs".into(), json!(wire));
            obj.insert("speedup_bound".into(), json!(one / (one / run.ranks as f64 + wire)));
        }
    }
    row
}

/// A share of the mean rank time, in percent.
fn share(r: &serde_json::Value, key: &str) -> f64 {
    let total = r["mean_secs"].as_f64().or(r["secs"].as_f64()).unwrap_or(f64::NAN);
    100.0 * r[key].as_f64().unwrap_or(0.0) / total
}

/// The rows as a table: MultiEdge's Table 1 (problem, one-process time) and its figures'
/// breakdowns and network statistics side by side.
pub fn table_of(rows: &[serde_json::Value]) -> comfy_table::Table {
    let mut t = rackwire_bench::table();
    t.set_header([
        "app",
        "problem",
        "ranks",
        "path",
        "secs",
        "spread",
        "speedup",
        "compute/data/lock/barrier/protocol %",
        "other threads' CPU %",
        "extra / out-of-order frames %",
        "faults / fetches / diffs (MB)",
        "rails floor s (bound)",
    ]);
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let shared = r["transport"] != "plain";
        let breakdown = ["compute_s", "data_wait_s", "lock_s", "barrier_s", "protocol_s"]
            .map(|k| format!("{:.0}", share(r, k)))
            .join("/");
        let data = f("data_frames");
        t.add_row([
            r["app"].as_str().unwrap_or("").to_string(),
            r["problem"].as_str().unwrap_or("").to_string(),
            r["ranks"].to_string(),
            r["transport"].as_str().unwrap_or("").to_string(),
            format!("{:.3}", f("secs")),
            format!("{:.3}–{:.3}", f("secs_lo"), f("secs_hi")),
            if r["repeats"].as_u64() > Some(1) {
                format!("{:.2}x ({:.2}–{:.2})", f("speedup"), f("speedup_lo"), f("speedup_hi"))
            } else {
                format!("{:.2}x", f("speedup"))
            },
            if shared { breakdown } else { "100/0/0/0/0".into() },
            if shared { format!("{:.1}", 100.0 * f("other_threads_cpu_s") / f("mean_secs")) } else { String::new() },
            if shared && data > 0.0 {
                format!("{:.1}", 100.0 * (f("frames_sent") - data) / data)
            } else {
                String::new()
            },
            if shared {
                format!("{:.0} / {:.0} / {:.0} ({:.1})", f("faults"), f("fetches"), f("diffs"), f("diff_bytes") / 1e6)
            } else {
                String::new()
            },
            if r["rails_secs"].is_number() {
                format!("{:.3} ({:.2}x)", f("rails_secs"), f("speedup_bound"))
            } else {
                String::new()
            },
        ]);
    }
    t
}

/// `rackwire eval dsm`.
pub fn run(a: &EvalArgs) -> Result<()> {
    let rows = match &a.from {
        Some(file) => {
            let doc: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?,
            )
            .with_context(|| format!("{}: not the JSON of `rackwire eval dsm --json`", file.display()))?;
            doc["rows"].as_array().cloned().with_context(|| format!("{}: no rows", file.display()))?
        }
        None => measure_rows(a)?,
    };
    // The ranks of every run shared this machine's cores (a virtual rack's hosts are on it).
    let cores = rackwire_rack::cores::usable().map(|c| c.len()).unwrap_or(1);
    let model = crate::dsm_model::model(&rows, a.predict, cores);
    if a.json {
        let meta = json!({ "command": std::env::args().collect::<Vec<_>>().join(" ") });
        println!("{}", serde_json::to_string_pretty(&json!({ "meta": meta, "rows": rows, "model": model }))?);
    } else {
        println!("{}", table_of(&rows));
        println!("(secs: the kernel's, the slowest rank's; speedup: the one-process run's time over this row's, same repeat, median with spread; breakdown: each rank's kernel time by where it went, mean over the ranks; other threads' CPU: the transport's and the fault service's, over the kernel's time; extra frames: frames sent beyond data frames, over data frames; out of order: data frames that arrived beyond a gap, over data frames; rails floor: a rank's share of the pages and diffs moved, at the rails' line rate, and the speedup left at most if it does not overlap the compute; every shared run's result equals the one-process run's, Water's to rounding)");
        if let Some(m) = model {
            println!("{}", model_table(&m));
        }
    }
    Ok(())
}

/// The model as a table: each shared run measured and predicted, then each application at the
/// rank count predicted for.
fn model_table(m: &serde_json::Value) -> String {
    let c = &m["costs"];
    let mut t = rackwire_bench::table();
    t.set_header(["app", "ranks", "measured s", "model s", "model error"]);
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    for r in m["checks"].as_array().into_iter().flatten() {
        let fitted = if r["fitted_on"] == true { " (fitted)" } else { "" };
        t.add_row([
            r["app"].as_str().unwrap_or("").to_string(),
            r["ranks"].to_string(),
            format!("{:.3}", f(r, "measured_s")),
            format!("{:.3}", f(r, "predicted_s")),
            format!("{:+.0}%{fitted}", 100.0 * f(r, "error")),
        ]);
    }
    for r in m["predictions"].as_array().into_iter().flatten() {
        t.add_row([
            r["app"].as_str().unwrap_or("").to_string(),
            r["ranks"].to_string(),
            String::new(),
            format!("{:.3}", f(r, "predicted_s")),
            format!("speedup {:.1}x", f(r, "speedup")),
        ]);
    }
    format!(
        "model (fitted at {} ranks on {} cores: {:.1} µs a page, {:.0} µs a barrier or lock, {:.1} ns a diff byte):\n{t}",
        m["fitted_at_ranks"],
        m["cores"],
        1e6 * f(c, "per_page_s"),
        1e6 * f(c, "per_sync_s"),
        1e9 * f(c, "per_diff_byte_s")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the rank counts by hand: powers of two below --ranks, then --ranks itself.
    #[test]
    fn rank_counts_double_up_to_the_ranks_asked() {
        assert_eq!(rank_counts(1), [1]);
        assert_eq!(rank_counts(2), [1, 2]);
        assert_eq!(rank_counts(4), [1, 2, 4]);
        assert_eq!(rank_counts(3), [1, 2, 3]);
        assert_eq!(rank_counts(6), [1, 2, 4, 6]);
    }
}
