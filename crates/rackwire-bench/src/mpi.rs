//! `rackwire bench mpi`: one MPI program (`peers/mpi_p2p.c`: ping-pong, bandwidth, MPI_Put,
//! allreduce, alltoallv, by the OSU benchmarks' method) under Open MPI between two processes,
//! over the rackwire libfabric provider (`pml cm`, `mtl ofi` restricted to it, one-sided through
//! `osc pt2pt`) and over Open MPI's own transports as its users get them, in the same run, the
//! order rotated every repeat. On this machine: against `pml ob1` with `btl vader` (its shared
//! memory) and with `btl tcp`. With `--rack`: the two ranks in the first two hosts of a virtual
//! rack (memory domains of their own, so rackwire goes over the edge transport on every rail)
//! against `btl tcp` over every rail (as over several NICs), one-sided through `osc pt2pt`.
//! Reported: each figure's median run with the spread, and rackwire's per-repeat ratio against
//! each.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::repeat::median_spread;
use anyhow::{bail, Context, Result};
use rackwire::ManagementHost;

use crate::mpi_rack::MpiRack;

/// Repeats at most.
const REPEAT_MAX: usize = 50;
/// The cache-line ping-pong's share of its full count of rounds, in each repeat.
const CACHELINE_SCALE: f64 = 0.25;
const SECRET: &str = "rackwire-bench-mpi-secret";
/// Our provider's mpirun arguments.
const RACKWIRE: &[&str] = &[
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
    "--mca",
    "osc",
    "pt2pt",
];
/// The transports on this machine, rackwire first, each with the mpirun arguments that pick it.
const HERE: [(&str, &[&str]); 3] = [
    ("rackwire", RACKWIRE),
    ("vader", &["--mca", "pml", "ob1", "--mca", "btl", "self,vader"]),
    // Open MPI 4.1 finds no one-sided component on its own over `btl tcp` (MPI_Win_create
    // fails): `osc pt2pt` is what its users give it.
    ("tcp", &["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "osc", "pt2pt"]),
];
/// The transports over a rack (`tcp`'s btl comes with [`MpiRack::mpirun_tcp`]).
const RACK: [(&str, &[&str]); 2] = [("rackwire", RACKWIRE), ("tcp", &["--mca", "pml", "ob1", "--mca", "osc", "pt2pt"])];
/// The figures, their units, and whether more is better.
const FIGURES: [(&str, &str, bool); 5] = [
    ("pingpong_8B_us", "8 B ping-pong, µs", false),
    ("bw_1MiB_MBs", "1 MiB bandwidth, MB/s", true),
    ("put_1MiB_MBs", "MPI_Put 1 MiB, MB/s", true),
    ("allreduce_64KiB_us", "allreduce 64 KiB, µs", false),
    ("alltoallv_64KiB_us", "alltoallv 64 KiB, µs", false),
];

/// Where the two ranks run.
enum Place<'a> {
    /// On this machine, joining the management host at this address.
    Here(&'a str),
    /// In the first two hosts of a rack.
    Rack(&'a MpiRack),
}

/// One run of the program over transport `name` (mpirun arguments `args`); its figures.
fn run_once(
    exe: &Path,
    name: &str,
    args: &[&str],
    scale: f64,
    dir: &Path,
    place: &Place,
) -> Result<BTreeMap<String, f64>> {
    let mut cmd = match place {
        Place::Here(mh) => {
            let mut c = Command::new("mpirun");
            c.args(["-x", rackwire::vars::MH, "-x", rackwire::vars::SECRET])
                .env(rackwire::vars::MH, mh)
                .env(rackwire::vars::SECRET, SECRET);
            c
        }
        Place::Rack(r) if name == "tcp" => r.mpirun_tcp(2),
        // Each host's daemon has that host's fabric settings (see `MpiRack::new`).
        Place::Rack(r) => r.mpirun(2),
    };
    let o = cmd
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .args(args)
        .args(["-x", "FI_PROVIDER_PATH"])
        .env("FI_PROVIDER_PATH", dir)
        .env_remove(rackwire::vars::NAME)
        .env_remove(rackwire::vars::CONFIG)
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

/// `rackwire bench mpi` (over the rack `rack` describes, if given).
pub fn run(repeat: usize, scale: f64, json: bool, rack: Option<&Path>) -> Result<()> {
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    let dir = crate::ofi::provider_dir()?;
    let work = std::env::temp_dir().join(format!("rackwire-bench-mpi-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let exe = crate::coll::build_mpi(&work, "mpi_p2p", include_str!("programs/mpi_p2p.c"))?;
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes())?;
    let addr = mh.addr().to_string();
    let (state, _down) = crate::ofi::rack_for_two(rack)?;
    let mpi_rack = state.as_ref().map(|s| MpiRack::new(s, &work, true)).transpose()?;
    let (place, transports): (Place, &[(&str, &[&str])]) = match &mpi_rack {
        None => (Place::Here(&addr), &HERE),
        Some(r) => (Place::Rack(r), &RACK),
    };
    let mut runs: BTreeMap<&str, Vec<BTreeMap<String, f64>>> = BTreeMap::new();
    // The floor of any ping-pong on this machine, measured in every repeat beside the
    // programs: how long the two cores take to hand one cache line back and forth (half a round
    // trip). A shared machine's cores move closer or further apart from one hour to the next;
    // the 8-byte rows are read against it.
    let mut floor = Vec::with_capacity(repeat);
    for rep in 0..repeat {
        if mpi_rack.is_none() {
            floor.push(crate::limit::cacheline_row(CACHELINE_SCALE).lat_us_p50.unwrap_or(f64::NAN));
        }
        for i in 0..transports.len() {
            let (name, args) = transports[(i + rep) % transports.len()];
            let figures = run_once(&exe, name, args, scale, &dir, &place)?;
            if FIGURES.iter().any(|(k, _, _)| !figures.contains_key(*k)) {
                bail!("the program over {name} printed {figures:?}");
            }
            runs.entry(name).or_default().push(figures);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    let fmt = |t: (f64, f64, f64), d: usize| format!("{:.*} ({:.*}–{:.*})", d, t.0, d, t.1, d, t.2);
    let triple = |t: (f64, f64, f64)| serde_json::json!({ "median": t.0, "lo": t.1, "hi": t.2 });
    let names: Vec<&str> = transports.iter().map(|(n, _)| *n).collect();
    let mut table = crate::table();
    let mut header = vec!["Open MPI, 2 ranks".to_string()];
    header.extend(names.iter().map(|n| n.to_string()));
    header.extend(names[1..].iter().map(|n| format!("rackwire / {n}")));
    table.set_header(header);
    let mut doc = serde_json::Map::new();
    for (key, label, _more_is_better) in FIGURES {
        let col = |t: &str| median_spread(&mut runs[t].iter().map(|f| f[key]).collect::<Vec<_>>());
        let ratio = |t: &str| {
            let ours = &runs["rackwire"];
            median_spread(&mut ours.iter().zip(&runs[t]).map(|(o, x)| o[key] / x[key]).collect::<Vec<_>>())
        };
        let d = if key.ends_with("MBs") { 0 } else { 2 };
        let mut row = vec![label.to_string()];
        row.extend(names.iter().map(|n| fmt(col(n), d)));
        row.extend(names[1..].iter().map(|n| fmt(ratio(n), 2)));
        table.add_row(row);
        let mut entry = serde_json::Map::new();
        for n in &names {
            entry.insert(n.to_string(), triple(col(n)));
        }
        for n in &names[1..] {
            entry.insert(format!("rackwire_over_{n}"), triple(ratio(n)));
        }
        doc.insert(key.to_string(), entry.into());
    }
    let rack_name = state.as_ref().map(|s| s.config.name.clone());
    let floor = (!floor.is_empty()).then(|| median_spread(&mut floor));
    if json {
        if let Some(f) = floor {
            doc.insert("cacheline_half_round_trip_us".into(), triple(f));
        }
        doc.insert("meta".into(), serde_json::json!({ "repeats": repeat, "scale": scale, "rack": rack_name }));
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("{table}");
    let over = rack_name.map_or("on this machine".to_string(), |r| format!("in two hosts of rack {r}"));
    println!(
        "(2 ranks {over}; {repeat} repeats, transports rotated; ratios per repeat: below 1 is faster for times, above 1 for bandwidth)"
    );
    if let Some(f) = floor {
        println!(
            "(a cache line handed between this machine's two cores and back, half the round trip: {} µs, the floor of any ping-pong here)",
            fmt(f, 3)
        );
    }
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
