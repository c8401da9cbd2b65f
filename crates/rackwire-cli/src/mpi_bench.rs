//! `rackwire bench mpi`: one MPI program (`peers/mpi_p2p.c`: ping-pong, bandwidth, allreduce,
//! alltoallv, by the OSU benchmarks' method) under Open MPI between two processes of this
//! machine, over the rackwire libfabric provider (`pml cm`, `mtl ofi` restricted to it) and
//! over Open MPI's own transports as its users get them (`pml ob1` with `btl vader`, its shared
//! memory, and with `btl tcp`), in the same run, the order rotated every repeat. Reported:
//! each figure's median run with the spread, and rackwire's per-repeat ratio against each.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use rackwire::ManagementHost;
use rackwire_bench::repeat::median_spread;

/// Repeats at most.
const REPEAT_MAX: usize = 50;
const SECRET: &str = "rackwire-bench-mpi-secret";
/// The transports, rackwire first, each with the mpirun arguments that pick it.
const TRANSPORTS: [(&str, &[&str]); 3] = [
    (
        "rackwire",
        &[
            "--mca",
            "pml",
            "cm",
            "--mca",
            "mtl",
            "ofi",
            "--mca",
            "mtl_ofi_provider_include",
            "rackwire",
            "--mca",
            "btl",
            "self",
        ],
    ),
    ("vader", &["--mca", "pml", "ob1", "--mca", "btl", "self,vader"]),
    ("tcp", &["--mca", "pml", "ob1", "--mca", "btl", "self,tcp"]),
];
/// The figures, their units, and whether more is better.
const FIGURES: [(&str, &str, bool); 4] = [
    ("pingpong_8B_us", "8 B ping-pong, µs", false),
    ("bw_1MiB_MBs", "1 MiB bandwidth, MB/s", true),
    ("allreduce_64KiB_us", "allreduce 64 KiB, µs", false),
    ("alltoallv_64KiB_us", "alltoallv 64 KiB, µs", false),
];

/// One run of the program over `args`' transport; its figures.
fn run_once(exe: &Path, args: &[&str], scale: f64, dir: &Path, mh: &str) -> Result<BTreeMap<String, f64>> {
    let o = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .args(args)
        .args(["-x", "FI_PROVIDER_PATH", "-x", "RACKWIRE_MH", "-x", "RACKWIRE_SECRET"])
        .env("FI_PROVIDER_PATH", dir)
        .env("RACKWIRE_MH", mh)
        .env("RACKWIRE_SECRET", SECRET)
        .env_remove("RACKWIRE_NAME")
        .env_remove("RACKWIRE_CONFIG")
        .arg(exe)
        .arg(scale.to_string())
        .output()
        .context("mpirun not found: install Debian's openmpi-bin")?;
    if !o.status.success() {
        bail!("mpirun {} failed:\n{}", args.join(" "), String::from_utf8_lossy(&o.stderr));
    }
    Ok(parse(&String::from_utf8_lossy(&o.stdout)))
}

fn parse(out: &str) -> BTreeMap<String, f64> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            (f.next()? == "ROW").then_some(())?;
            Some((f.next()?.to_string(), f.next()?.parse().ok()?))
        })
        .collect()
}

/// `rackwire bench mpi`.
pub(crate) fn run(repeat: usize, scale: f64, json: bool) -> Result<()> {
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    let dir = crate::ofi_bench::provider_dir()?;
    let work = std::env::temp_dir().join(format!("rackwire-bench-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let exe = crate::coll_bench::build_mpi(&work, "mpi_p2p", include_str!("peers/mpi_p2p.c"))?;
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes())?;
    let addr = mh.addr().to_string();
    let mut runs: BTreeMap<&str, Vec<BTreeMap<String, f64>>> = BTreeMap::new();
    for rep in 0..repeat {
        for i in 0..TRANSPORTS.len() {
            let (name, args) = TRANSPORTS[(i + rep) % TRANSPORTS.len()];
            let figures = run_once(&exe, args, scale, &dir, &addr)?;
            if FIGURES.iter().any(|(k, _, _)| !figures.contains_key(*k)) {
                bail!("the program over {name} printed {figures:?}");
            }
            runs.entry(name).or_default().push(figures);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    let fmt = |t: (f64, f64, f64), d: usize| format!("{:.*} ({:.*}–{:.*})", d, t.0, d, t.1, d, t.2);
    let triple = |t: (f64, f64, f64)| serde_json::json!({ "median": t.0, "lo": t.1, "hi": t.2 });
    let mut table = comfy_table::Table::new();
    table.set_header(["Open MPI, 2 ranks", "rackwire", "vader", "tcp", "rackwire / vader", "rackwire / tcp"]);
    let mut doc = serde_json::Map::new();
    for (key, label, _more_is_better) in FIGURES {
        let col = |t: &str| median_spread(&mut runs[t].iter().map(|f| f[key]).collect::<Vec<_>>());
        let ratio = |t: &str| {
            let ours = &runs["rackwire"];
            median_spread(&mut ours.iter().zip(&runs[t]).map(|(o, x)| o[key] / x[key]).collect::<Vec<_>>())
        };
        let d = if key.starts_with("bw") { 0 } else { 2 };
        table.add_row([
            label.to_string(),
            fmt(col("rackwire"), d),
            fmt(col("vader"), d),
            fmt(col("tcp"), d),
            fmt(ratio("vader"), 2),
            fmt(ratio("tcp"), 2),
        ]);
        doc.insert(
            key.to_string(),
            serde_json::json!({
                "rackwire": triple(col("rackwire")), "vader": triple(col("vader")), "tcp": triple(col("tcp")),
                "rackwire_over_vader": triple(ratio("vader")), "rackwire_over_tcp": triple(ratio("tcp")),
            }),
        );
    }
    if json {
        doc.insert("meta".into(), serde_json::json!({ "repeats": repeat, "scale": scale }));
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("{table}");
    println!(
        "({repeat} repeats, transports rotated; ratios per repeat: below 1 is faster for times, above 1 for bandwidth)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the parser: ROW lines give their figure, anything else (Open MPI's own lines) is
    // skipped, and a malformed value is dropped rather than read as a number.
    #[test]
    fn rows_are_read() {
        let rows = parse("ROW pingpong_8B_us 0.5258\nsome warning\nROW bw_1MiB_MBs 10978.8\nROW bad x\n");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows["pingpong_8B_us"], 0.5258);
        assert_eq!(rows["bw_1MiB_MBs"], 10978.8);
    }
}
