//! The shared-memory study as a user runs it: `rackwire eval dsm`, the applications over the
//! shared virtual memory at 1 and 2 ranks against one process on plain memory, across real
//! processes, small scale. Every shared run checks its result against the one-process run's
//! (the job fails otherwise); these tests check that every row says so and carries what the
//! report is made of.

use std::process::{Command, Output};

const APPS: [&str; 4] = ["fft", "lu", "radix", "water"];

fn eval_dsm(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rackwire"))
        .args(["eval", "dsm"])
        .args(args)
        .env_remove(rackwire::vars::MH)
        .envs(env.iter().copied())
        .output()
        .expect("run rackwire eval dsm")
}

fn rows(o: &Output) -> Vec<serde_json::Value> {
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "eval dsm failed:\n{out}{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
    doc["rows"].as_array().expect("rows").clone()
}

/// For each of `apps`: a one-process row and a row per rank count, every one checked, with a
/// positive time and speedup; the shared rows over `transport` with their breakdown (each
/// part at least zero, together no more than the rank's time) and their counters.
fn assert_rows(rows: &[serde_json::Value], apps: &[&str], ranks: &[u64], transport: &str) {
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
// fetched pages from the other rank.
#[test]
fn applications_run_checked_against_one_process() {
    let rows = rows(&eval_dsm(&["--ranks", "2", "--scale", "0.01", "--json"], &[]));
    assert_rows(&rows, &APPS, &[1, 2], "shm");
    let fft2 = rows.iter().find(|r| r["app"] == "fft" && r["ranks"] == 2).unwrap();
    assert!(fft2["fetches"].as_f64().is_some_and(|f| f > 0.0), "{fft2}");
}

// Checks two applications at 2 ranks over the edge transport on loopback with delivery in
// order (--ordered): both checked, data frames counted, and every frame that arrived beyond a
// gap waited for it (held equals out of order).
#[test]
fn applications_over_the_edge_transport_in_order() {
    let env = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "127.0.0.1:0")];
    let rows = rows(&eval_dsm(&["--ranks", "2", "--scale", "0.01", "--app", "fft,water", "--ordered", "--json"], &env));
    assert_rows(&rows, &["fft", "water"], &[1, 2], "edge");
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
    let rows = rows(&eval_dsm(&["--ranks", "2", "--scale", "0.001", "--app", "lu", "--rack", rack, "--json"], &[]));
    assert_rows(&rows, &["lu"], &[1, 2], "edge");
    let two = rows.iter().find(|r| r["ranks"] == 2).unwrap();
    assert!(two["rails_secs"].as_f64().is_some_and(|s| s > 0.0), "{two}");
    assert!(two["speedup_bound"].as_f64().is_some_and(|b| b > 0.0 && b <= 2.0), "{two}");
}

// Checks that a bad application name gets a clear error before anything runs.
#[test]
fn an_unknown_application_is_refused() {
    let o = eval_dsm(&["--app", "quicksort"], &[]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no application \"quicksort\""), "{o:?}");
}
