//! Jobs of ranks across real processes: `rackwire launch` starting `rw-collcheck` ranks on
//! shared memory and on the edge transport, a rank killed mid-allreduce, and a job started by
//! Open MPI's mpirun.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rackwire_tests::{collcheck_bin, TestMh, SECRET};

fn launch(n: usize, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rackwire"))
        .args(["launch", "-n", &n.to_string(), "--"])
        .arg(collcheck_bin())
        .args(args)
        .env_remove(rackwire::vars::MH)
        .envs(env.iter().copied())
        .output()
        .expect("run rackwire launch")
}

fn lines(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Every rank printed `ok`, prefixed with its rank, and the launcher exited 0.
fn assert_all_ok(n: usize, o: &Output) {
    let out = lines(o);
    assert!(o.status.success(), "launch -n {n} failed:\n{out}");
    for r in 0..n {
        assert!(out.lines().any(|l| l == format!("[{r}] ok")), "rank {r} did not say ok:\n{out}");
    }
}

// Checks every collective, and the v-variants with random counts (up to 40000 bytes, so that
// alltoallv_to writes some blocks straight into place and stages others), across real processes at
// group sizes 1, 2, 3, 5 and 8 over shared memory, against results each rank computes
// locally (rw-collcheck exits non-zero on any mismatch); also that launch prefixes each
// rank's lines with its rank and exits 0 only when all did.
#[test]
fn collectives_across_processes_over_shared_memory() {
    for n in [1, 2, 3, 5, 8] {
        assert_all_ok(n, &launch(n, &[], &["all", "0,8,1000,70000", "3", "40000"]));
    }
}

// The same over the edge transport (UDP on loopback), every pair of ranks on it.
#[test]
fn collectives_across_processes_over_the_edge_transport() {
    let env = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "127.0.0.1:0")];
    for n in [2, 3, 5, 8] {
        assert_all_ok(n, &launch(n, &env, &["all", "0,8,70000", "2", "40000"]));
    }
}

// Checks `launch --rack` (root; skipped with a message otherwise): five ranks spread over the
// four hosts of a two-rack virtual rack, so pairs in one memory domain use shared memory and
// the others the edge transport over the rack's rail; every rank reports the transports it
// was given (both kinds present) and every collective checks out.
#[test]
fn collectives_over_a_virtual_rack_mix_transports() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipping: launch --rack builds a virtual rack and needs root");
        return;
    }
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/racks/tworacks.toml");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_rackwire"))
            .args(["launch", "-n", "5", "--rack", config, "--"])
            .arg(collcheck_bin())
            .args(args)
            .env_remove(rackwire::vars::MH)
            .output()
            .expect("run rackwire launch --rack")
    };
    let info = run(&["info"]);
    assert_all_ok(5, &info);
    let out = lines(&info);
    // Ranks 0 and 1 are on a1 (domain a), 2 on a2 (domain a), 3 and 4 on the b hosts.
    let r0 = out.lines().find(|l| l.starts_with("[0] rank 0")).expect("rank 0's line");
    assert!(r0.ends_with("transports self,shm,shm,edge,edge"), "{r0}");
    assert_all_ok(5, &run(&["all", "0,8,70000", "2", "3000"]));
}

// Checks the launcher's failure path: a rank that exits non-zero (an unknown scenario makes
// every rank fail with exit code 3) makes the launcher exit with that status.
#[test]
fn launch_exits_with_the_first_failing_status() {
    let o = launch(2, &[], &["no-such-scenario"]);
    assert_eq!(o.status.code(), Some(3), "{}", lines(&o));
    let o = Command::new(env!("CARGO_BIN_EXE_rackwire")).args(["launch", "-n", "0", "--", "true"]).output().unwrap();
    assert!(!o.status.success() && lines(&o).contains("-n must be"), "{}", lines(&o));
}

// Checks that the launcher forwards every line its ranks print, including the last ones
// written just before a rank exits: four ranks each print 3000 numbered lines and exit at
// once; every rank's lines all arrive, prefixed with its rank, in its order.
#[test]
fn launch_forwards_every_line_before_it_exits() {
    const LINES: usize = 3000;
    let o = Command::new(env!("CARGO_BIN_EXE_rackwire"))
        .args(["launch", "-n", "4", "--", "seq", "1", &LINES.to_string()])
        .env_remove(rackwire::vars::MH)
        .output()
        .expect("run rackwire launch");
    assert!(o.status.success(), "{}", lines(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for r in 0..4 {
        let prefix = format!("[{r}] ");
        let got: Vec<usize> = out.lines().filter_map(|l| l.strip_prefix(&prefix)?.parse().ok()).collect();
        assert_eq!(got, (1..=LINES).collect::<Vec<_>>(), "rank {r}'s lines");
    }
}

// Checks that a rank killed in the middle of an allreduce loop makes every other rank fail
// with a rank-gone error within seconds (not hang, not time out): three ranks started here
// directly (no launcher, which would stop them itself), rank 1 killed once all loop. The
// first survivor to notice names rank 1; the other may instead see that survivor leave
// first (it waits for both), so it names rank 1 or that survivor.
#[test]
fn a_killed_rank_makes_the_others_fail_not_hang() {
    let mh = TestMh::start("coll-kill");
    let mut ranks: Vec<_> = (0..3)
        .map(|r| {
            Command::new(collcheck_bin())
                .args(["allreduce-loop", "100000000"])
                .env(rackwire::vars::MH, &mh.addr)
                .env(rackwire::vars::SECRET, SECRET)
                .env(rackwire::vars::STATE_DIR, rackwire_tests::state_dir())
                .env(rackwire::vars::RANK, r.to_string())
                .env(rackwire::vars::SIZE, "3")
                .env(rackwire::vars::JOB, "killjob")
                .env(rackwire::vars::GROUP_TIMEOUT_MS, "60000")
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a rank")
        })
        .collect();
    let mut outs: Vec<_> = ranks.iter_mut().map(|c| BufReader::new(c.stdout.take().unwrap())).collect();
    for (r, o) in outs.iter_mut().enumerate() {
        let mut l = String::new();
        o.read_line(&mut l).unwrap();
        assert_eq!(l.trim(), "looping", "rank {r}");
    }
    std::thread::sleep(Duration::from_millis(100));
    let killed_at = Instant::now();
    ranks[1].kill().unwrap();
    ranks[1].wait().unwrap();
    let mut named = Vec::new();
    for r in [0, 2] {
        let status = ranks[r].wait().unwrap();
        let mut l = String::new();
        outs[r].read_line(&mut l).unwrap();
        let other = 2 - r;
        assert!(
            l.starts_with("error rank_gone: rank 1") || l.starts_with(&format!("error rank_gone: rank {other}")),
            "rank {r} said {l:?}"
        );
        assert_eq!(status.code(), Some(3), "rank {r}");
        named.push(l);
    }
    assert!(named.iter().any(|l| l.starts_with("error rank_gone: rank 1")), "nobody named rank 1: {named:?}");
    // Far below the 60 s group timeout: the loss was seen, not waited out.
    assert!(killed_at.elapsed() < Duration::from_secs(15), "took {:?}", killed_at.elapsed());
}

// Checks that a program started by Open MPI's mpirun (with RACKWIRE_MH pointing at a running
// management host) forms a group from mpirun's variables: each of three ranks reports its
// rank, the size and shared memory to the others. Skipped with a message without mpirun.
#[test]
fn a_program_started_by_mpirun_forms_a_group() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("skipped: mpirun not installed (Debian package openmpi-bin)");
        return;
    }
    let mh = TestMh::start("coll-mpirun");
    let o = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .args(["-x", rackwire::vars::MH, "-x", rackwire::vars::SECRET, "-x", rackwire::vars::JOB])
        .arg(collcheck_bin())
        .args(["info"])
        .env(rackwire::vars::MH, &mh.addr)
        .env(rackwire::vars::SECRET, SECRET)
        .env(rackwire::vars::STATE_DIR, rackwire_tests::state_dir())
        .env(rackwire::vars::JOB, "mpijob")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .output()
        .expect("run mpirun");
    let out = lines(&o);
    assert!(o.status.success(), "mpirun failed:\n{out}");
    for r in 0..3 {
        let want = format!("rank {r} size 3 job mpijob transports");
        assert!(out.lines().any(|l| l.starts_with(&want) && l.contains("shm")), "no line {want:?}:\n{out}");
    }
    assert_eq!(out.lines().filter(|l| *l == "ok").count(), 3, "{out}");
}

// Checks `bench coll` end to end at tiny scale so it does not rot: the JSON document has a row
// per collective and size with the keys the issue asks for and positive latencies, and with
// --peers (where mpicc is installed) Open MPI rows for the same collectives and sizes, our rows
// carrying their ratio to those.
#[test]
fn bench_coll_json_has_rows_with_peers() {
    let o = Command::new(env!("CARGO_BIN_EXE_rackwire"))
        .args(["bench", "coll", "--ranks", "2", "--op", "barrier,alltoallv", "--size", "8,4K", "--scale", "0.01"])
        .args(["--json", "--peers"])
        .env_remove(rackwire::vars::MH)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", lines(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    let rows = doc["rows"].as_array().expect("rows");
    let peers = Command::new("mpicc").arg("--version").output().is_ok();
    for t in ["shm"].into_iter().chain(peers.then_some("openmpi")) {
        for (p, size) in [("barrier", 0), ("alltoallv", 8), ("alltoallv", 4096)] {
            let r = rows
                .iter()
                .find(|r| r["transport"] == t && r["pattern"] == p && r["size"] == size)
                .unwrap_or_else(|| panic!("no {t} {p} {size} row in {rows:?}"));
            for k in ["lat_us_avg", "lat_us_min", "lat_us_max"] {
                assert!(r[k].as_f64().is_some_and(|v| v > 0.0), "{k} of {r}");
            }
            assert_eq!(r["ranks"], 2);
            assert!(r["iters"].as_u64().is_some_and(|i| i >= 5));
            // With the peer measured, each of our rows carries its ratio to the peer's row of
            // the same op and size (one repeat: exactly the quotient of the two averages).
            if peers && t == "shm" {
                let theirs = rows
                    .iter()
                    .find(|q| q["transport"] == "openmpi" && q["pattern"] == p && q["size"] == size)
                    .expect("the peer's row");
                let want = r["lat_us_avg"].as_f64().unwrap() / theirs["lat_us_avg"].as_f64().unwrap();
                let got = r["vs_peer"]["ratio"].as_f64().unwrap_or_else(|| panic!("no ratio in {r}"));
                assert!((got - want).abs() <= 1e-9 * want, "ratio {got}, averages say {want}");
            }
        }
    }
}

// Checks that a job `rackwire launch` starts is its ranks' alone (issue: ranks went to whoever
// posted round 0 first, and a node registering `JOB.RANK` first locked the real rank out):
// on a shared management host, a node holding the fabric secret first takes the names
// `victim.0` and `victim.1` and claims ranks 0 and 1 of job `victim` (round 0, as the ranks
// would); then `rackwire launch -n 2 --job victim` runs on that management host, and every
// rank checks out (the launcher's token keeps the job, and its ranks' names, apart from the
// intruder's); the intruder's job of the same name holds only the intruder.
#[test]
fn a_launched_job_cannot_be_taken_by_another_node_with_the_secret() {
    let mh = TestMh::start("launch-hijack");
    let join = |name: &str| {
        let mut c = rackwire::FabricConfig::new(&mh.addr, SECRET, name);
        c.state_dir = Some(std::env::temp_dir().join(format!("rw-hijack-{}-{name}", std::process::id())));
        rackwire::Fabric::join(c).expect("the intruder joins")
    };
    let squatters = [join("victim.0"), join("victim.1")];
    for (rank, f) in squatters.iter().enumerate() {
        f.job_post("victim", None, 2, rank as u32, 0, b"").expect("the intruder's post");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_rackwire"))
        .args(["launch", "-n", "2", "--job", "victim", "--"])
        .arg(collcheck_bin())
        .args(["all", "0,8,1000", "1", "1000"])
        .env(rackwire::vars::MH, &mh.addr)
        .env(rackwire::vars::SECRET, SECRET)
        .env(rackwire::vars::STATE_DIR, rackwire_tests::state_dir())
        .output()
        .expect("run rackwire launch");
    assert_all_ok(2, &o);
    let theirs = squatters[0].job_round("victim", None, 0).unwrap();
    let members: Vec<u32> = theirs.members.iter().flatten().map(|m| m.node).collect();
    assert_eq!(members, vec![squatters[0].id(), squatters[1].id()], "the intruder's job is its own");
}
