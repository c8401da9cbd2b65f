//! The data workloads as a user runs them: `rackwire eval sort|grep|energy`, each over the
//! fabric and over TCP, across real processes, small scale. Each run checks its own output
//! (the sort as valsort does, grep against the records the generator planted matches in)
//! and fails when it is wrong; these tests check that every run reported itself checked and
//! that the rows carry what the issue asks of them. And the shared-memory study, `rackwire
//! eval dsm`: the applications over the shared virtual memory against one process on plain
//! memory, every shared result checked against that run's (the job fails otherwise).

use std::process::{Command, Output};

fn eval(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rackwire"))
        .arg("eval")
        .args(args)
        .env_remove(rackwire::vars::MH)
        .envs(env.iter().copied())
        .output()
        .expect("run rackwire eval")
}

fn rows(o: &Output) -> Vec<serde_json::Value> {
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "eval failed:\n{out}{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    doc["rows"].as_array().expect("rows").clone()
}

/// Each row was checked, has the fields of the issue (the machine's busy time among them, a
/// count of 10 ms ticks that cannot be below zero), and both paths are there (with
/// `fabric_rpc`, the key-value store's requests over the fabric too).
fn assert_rows(rows: &[serde_json::Value], pattern: &str, phases: &[&str]) {
    assert_rows_of(rows, pattern, phases, false)
}

fn assert_rows_of(rows: &[serde_json::Value], pattern: &str, phases: &[&str], fabric_rpc: bool) {
    let of: Vec<&serde_json::Value> = rows.iter().filter(|r| r["pattern"] == pattern).collect();
    assert_eq!(of.len(), 2 + fabric_rpc as usize, "{pattern}: a fabric and a TCP row: {rows:?}");
    if fabric_rpc {
        assert!(of.iter().any(|r| r["net"] == "fabric-rpc" && r["transport"] == "shm"), "{of:?}");
    }
    for r in &of {
        assert_eq!(r["checked"], true, "{r}");
        for k in ["transport", "ranks", "bytes", "secs", "mb_per_s", "speedup", "cpu_secs"] {
            assert!(!r[k].is_null(), "{pattern}: no {k} in {r}");
        }
        assert!(r["host_cpu_secs"].as_f64().is_some_and(|h| h >= 0.0), "{pattern}: the machine's busy time in {r}");
        for p in phases {
            assert!(r["phases"][*p].as_f64().is_some_and(|s| s >= 0.0), "{pattern}: phase {p} in {r}");
        }
        assert!(r["energy_model"]["joules_est"].as_f64().is_some_and(|j| j > 0.0), "{r}");
    }
    assert!(of.iter().any(|r| r["net"] == "fabric" && r["transport"] == "shm"), "{of:?}");
    assert!(of.iter().any(|r| r["net"] == "tcp" && r["transport"] == "tcp" && r["speedup"] == 1.0), "{of:?}");
}

// Checks the sort over both paths at 3 ranks (an odd count, so the key ranges and shares are
// uneven): both runs validated (order within and across ranks, count and checksum), with
// the five phases timed.
#[test]
fn sort_runs_checked_over_fabric_and_tcp() {
    let o = eval(&["sort", "--ranks", "3", "--scale", "0.01", "--json"], &[]);
    assert_rows(&rows(&o), "sort", &["read", "partition", "shuffle", "sort", "write"]);
}

// Checks the four grep variants over both paths at 2 ranks: rank 0 gathered exactly the
// matching records on every run.
#[test]
fn grep_variants_run_checked_over_fabric_and_tcp() {
    let o = eval(&["grep", "--ranks", "2", "--scale", "0.005", "--json"], &[]);
    let rows = rows(&o);
    for v in ["LoN-LoC", "LoN-HiC", "HiN-LoC", "HiN-HiC"] {
        assert_rows(&rows, &format!("grep/{v}"), &["scan", "reduce"]);
    }
}

// Checks the replicated block writes over both paths at 4 ranks (three replicas of every
// block on the other three): every replica byte-identical to what its writer wrote (the run
// fails otherwise), and TestDFSIO's figures present and positive.
#[test]
fn dfsio_runs_checked_over_fabric_and_tcp() {
    let o = eval(&["dfsio", "--ranks", "4", "--scale", "0.05", "--json"], &[]);
    let rows = rows(&o);
    assert_rows(&rows, "dfsio", &["write"]);
    for r in &rows {
        for k in ["throughput_mb_per_s", "io_rate_avg_mb_per_s", "io_rate_std_mb_per_s"] {
            assert!(r[k].as_f64().is_some_and(|v| v >= 0.0), "{k} in {r}");
        }
        assert!(r["throughput_mb_per_s"].as_f64().unwrap() > 0.0);
    }
}

// The same with the fabric on the edge transport (UDP on loopback), two replicas per block
// at 3 ranks.
#[test]
fn dfsio_over_the_edge_transport() {
    let env = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "127.0.0.1:0")];
    let o = eval(&["dfsio", "--ranks", "3", "--scale", "0.02", "--net", "fabric", "--json"], &env);
    let rows = rows(&o);
    assert_eq!(rows[0]["transport"], "udp", "{rows:?}");
    assert_eq!(rows[0]["checked"], true);
}

// Checks the key-value store over the fabric (one-sided reads), over the fabric as requests
// (fabric-rpc: TCP's algorithm on the fabric) and over TCP at 3 ranks, in YCSB's A and C and
// the 100% put mix: every value read carries its own key and checksum, and after the run
// every key read back over the data path equals what its owner last applied (the run fails
// otherwise); YCSB's figures present, and the read share near the mix's (A: 50%, C: 100%,
// put: none).
#[test]
fn kv_mixes_run_checked_over_fabric_and_tcp() {
    let o = eval(&["kv", "--ranks", "3", "--scale", "0.02", "--mix", "A,C,put", "--json"], &[]);
    let rows = rows(&o);
    for (mix, reads) in [("A", 0.5), ("C", 1.0), ("put", 0.0)] {
        assert_rows_of(&rows, &format!("kv/{mix}"), &["run"], true);
        for r in rows.iter().filter(|r| r["pattern"] == format!("kv/{mix}")) {
            let f = r;
            assert!(f["ops_per_s"].as_f64().unwrap() > 0.0, "{r}");
            assert!(f["lat_us_p50"].as_f64().unwrap() <= f["lat_us_p99"].as_f64().unwrap(), "{r}");
            assert!((f["read_share"].as_f64().unwrap() - reads).abs() < 0.05, "{r}");
        }
    }
}

// The same in the open-loop mode (operations due at a fixed rate) with the fabric on the
// edge transport.
#[test]
fn kv_open_loop_over_the_edge_transport() {
    let env = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "127.0.0.1:0")];
    let o = eval(
        &["kv", "--ranks", "2", "--scale", "0.01", "--mix", "B", "--rate", "2000", "--net", "fabric", "--json"],
        &env,
    );
    let rows = rows(&o);
    assert_eq!(rows[0]["transport"], "udp", "{rows:?}");
    assert_eq!(rows[0]["checked"], true);
}

// Checks the sort with the fabric on the edge transport (UDP on loopback) between all ranks:
// the fabric row names `udp`, and the run validated.
#[test]
fn sort_over_the_edge_transport() {
    let env = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "127.0.0.1:0")];
    let o = eval(&["sort", "--ranks", "2", "--scale", "0.01", "--net", "fabric", "--json"], &env);
    let rows = rows(&o);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["transport"], "udp", "{rows:?}");
    assert_eq!(rows[0]["checked"], true);
}

// Checks `eval energy`: HP's two tables (baseline 0% by definition, the other cells
// computed) and Marlin's Table 3 with its printed figures, from runs measured now.
#[test]
fn energy_tables_from_measured_runs() {
    let o = eval(&["energy", "--ranks", "2", "--scale", "0.002", "--json"], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let sort = doc["sort_efficiency"].as_array().unwrap();
    assert_eq!(sort[0]["cores"], 1);
    assert_eq!(sort[0]["10GbE"], 0.0, "the baseline against itself");
    assert!(sort[0]["PCIe"].as_f64().is_some());
    let grep = doc["grep_efficiency"].as_array().unwrap();
    assert_eq!(grep.len(), 4);
    for g in grep {
        assert_eq!(g["10GbE 1-core"], 0.0);
        assert!(g["PCIe 1-core"].as_f64().is_some(), "{g}");
    }
    let marlin = doc["marlin_table_3"].as_array().unwrap();
    let per: Vec<f64> = marlin.iter().map(|r| r["watts_per_gbit"].as_f64().unwrap()).collect();
    assert_eq!(per.len(), 3);
    assert!((per[0] - 1.283).abs() < 0.001 && (per[2] - 0.277).abs() < 0.001, "{per:?}");
    assert!(doc["meta"]["model"].as_str().unwrap().contains("estimates"));
}

// Checks that bad arguments get a clear error before anything runs.
#[test]
fn bad_arguments_are_refused() {
    for (args, says) in [
        (&["sort", "--net", "carrier-pigeon"][..], "unknown data path"),
        (&["grep", "--variant", "MidN"][..], "unknown grep variant"),
        (&["kv", "--mix", "D"][..], "unknown key-value mix"),
        (&["sort", "--net", "fabric-rpc"][..], "fabric-rpc is the key-value store's"),
        (&["kv", "--rate=0"][..], "--rate"),
        (&["sort", "--ranks", "0"][..], "--ranks"),
        (&["sort", "--scale", "0"][..], "--scale"),
        (&["sort", "--cores", "4096", "--ranks", "1", "--scale", "0.001"][..], "--cores"),
    ] {
        let o = eval(args, &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// The shared-memory study's applications.
const DSM_APPS: [&str; 4] = ["fft", "lu", "radix", "water"];

/// For each of `apps`: a one-process row and a row per rank count, every one checked, with a
/// positive time and speedup; the shared rows over `transport` with their breakdown (each
/// part at least zero, together no more than the rank's time) and their counters.
fn assert_dsm_rows(rows: &[serde_json::Value], apps: &[&str], ranks: &[u64], transport: &str) {
    for app in apps {
        let of: Vec<&serde_json::Value> = rows.iter().filter(|r| r["app"] == *app).collect();
        assert_eq!(of.len(), 1 + ranks.len(), "{app}: {of:?}");
        assert_eq!(of[0]["transport"], "plain", "{app}: the reference first");
        assert_eq!(of[0]["speedup"], 1.0);
        for r in &of {
            assert_eq!(r["checked"], true, "{r}");
            assert!(r["secs"].as_f64().is_some_and(|s| s > 0.0) && r["speedup"].as_f64().is_some_and(|s| s > 0.0));
        }
        for (r, n) in of[1..].iter().zip(ranks) {
            assert_eq!(r["ranks"].as_u64(), Some(*n), "{r}");
            if *n > 1 {
                assert_eq!(r["transport"], transport, "{r}");
            }
            let part = |k: &str| r[k].as_f64().unwrap_or(-1.0);
            let parts = ["compute_s", "data_wait_s", "lock_s", "barrier_s", "protocol_s"];
            assert!(parts.iter().all(|k| part(k) >= 0.0), "{app} at {n}: a part missing in {r}");
            let sum: f64 = parts.iter().map(|k| part(k)).sum();
            assert!(sum <= part("mean_secs") * 1.001 + 1e-6, "{app} at {n}: parts {sum} over the time {r}");
            assert!(part("faults") > 0.0, "{app} at {n}: the protocol saw no fault: {r}");
        }
    }
}

// Checks the four applications at 1 and 2 ranks over shared memory: each shared run's result
// equals the one-process run's (the job fails otherwise, so every row checked), each row has
// its breakdown and counters, and at 2 ranks FFT (whose transposes read the other rank's rows)
// fetched pages from the other rank. The ranks are processes of their own, and each run also
// fails unless every rank's view of the range sits at the same address (checked in the run:
// without the agreement on an address, it fails — tried).
#[test]
fn applications_run_checked_against_one_process() {
    let rows = rows(&eval(&["dsm", "--ranks", "2", "--scale", "0.01", "--json"], &[]));
    assert_dsm_rows(&rows, &DSM_APPS, &[1, 2], "shm");
    let fft2 = rows.iter().find(|r| r["app"] == "fft" && r["ranks"] == 2).unwrap();
    assert!(fft2["fetches"].as_f64().is_some_and(|f| f > 0.0), "{fft2}");
}

// Checks two applications at 2 ranks over the edge transport on loopback with delivery in
// order (--ordered): both checked, data frames counted, and every frame that arrived beyond a
// gap waited for it (held equals out of order).
#[test]
fn applications_over_the_edge_transport_in_order() {
    let env = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "127.0.0.1:0")];
    let rows =
        rows(&eval(&["dsm", "--ranks", "2", "--scale", "0.01", "--app", "fft,water", "--ordered", "--json"], &env));
    assert_dsm_rows(&rows, &["fft", "water"], &[1, 2], "edge");
    for r in rows.iter().filter(|r| r["ranks"] == 2) {
        assert!(r["data_frames"].as_f64().is_some_and(|d| d > 0.0), "{r}");
        assert_eq!(r["held"], r["out_of_order"], "{r}");
    }
}

// Checks the run on a virtual rack as the report's runs are made (root: namespaces): LU at 1
// and 2 ranks, a rank per host over two shaped rails, checked, over the edge transport, with
// the rails' floor and the speedup bound it leaves. Skipped, saying so, where not root.
#[test]
fn lu_on_a_virtual_rack() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED lu_on_a_virtual_rack: needs root (network namespaces)");
        return;
    }
    let rack = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/racks/dsm-2l-1g.toml");
    let rows = rows(&eval(&["dsm", "--ranks", "2", "--scale", "0.001", "--app", "lu", "--rack", rack, "--json"], &[]));
    assert_dsm_rows(&rows, &["lu"], &[1, 2], "edge");
    let two = rows.iter().find(|r| r["ranks"] == 2).unwrap();
    assert!(two["rails_secs"].as_f64().is_some_and(|s| s > 0.0), "{two}");
    assert!(two["speedup_bound"].as_f64().is_some_and(|b| b > 0.0 && b <= 2.0), "{two}");
}

// Checks that a bad application name gets a clear error before anything runs.
#[test]
fn an_unknown_application_is_refused() {
    let o = eval(&["dsm", "--app", "quicksort"], &[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no application \"quicksort\""), "{o:?}");
}
