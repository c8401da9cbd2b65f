//! The `rackwire` command as a user runs it: benchmarks with small parameters (so they do not
//! rot), the management host with `nodes` and `regions`, bad input, and a short demo.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rackwire_tests::{Reaped, TempDir};

const SECRET: &str = "cli-test-secret-0123456789";

fn rackwire(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rackwire"))
        .args(args)
        .env(rackwire::vars::SECRET, SECRET)
        .output()
        .expect("run rackwire")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

// Checks every benchmark pattern end to end at tiny scale, with the limits: the JSON
// document has a `rows` array, each pattern has a shm row per size with the keys DESIGN.md
// asks for and positive figures, memcpy rows are there for the same sizes, a `store` row for
// each small size, a `shm-pinned` ping-pong row and one `cacheline` ping-pong row (their
// figures are compared in the benchmark, not here).
#[test]
fn bench_json_has_rows_for_every_pattern() {
    let o = rackwire(&[
        "bench",
        "--transport",
        "shm",
        "--pattern",
        "pingpong,oneway,twoway,rate,table1",
        "--size",
        "8,64K",
        "--scale",
        "0.01",
        "--with-limit",
        "--json",
    ]);
    assert!(o.status.success(), "bench failed: {}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    let rows = doc["rows"].as_array().expect("rows array");
    let find = |t: &str, p: &str, size: u64| {
        rows.iter().find(|r| r["transport"] == t && r["pattern"] == p && r["size"] == size)
    };
    for size in [8u64, 65536] {
        let pp = find("shm", "pingpong", size).expect("pingpong row");
        assert!(pp["lat_us_p50"].as_f64().unwrap() > 0.0);
        assert!(pp["lat_us_p99"].as_f64().unwrap() >= pp["lat_us_p50"].as_f64().unwrap());
        // Ping-pong bandwidth counts the payload of both directions, so it is the size over the
        // mean one-way time (as UCX and fabtests report it), less only the loop's own overhead.
        let one_way = size as f64 / pp["lat_us_avg"].as_f64().unwrap();
        let share = pp["mb_per_s"].as_f64().unwrap() / one_way;
        assert!((0.7..=1.01).contains(&share), "ping-pong MB/s is {share} of size / one-way time");
        for p in ["oneway", "twoway", "rate"] {
            let r = find("shm", p, size).unwrap_or_else(|| panic!("{p} row at {size}"));
            assert!(r["mb_per_s"].as_f64().unwrap() > 0.0);
            assert!(r["msgs_per_s"].as_f64().unwrap() > 0.0);
            assert!(r["cpu_pct"].as_f64().is_some());
        }
        assert!(find("memcpy", "oneway", size).is_some(), "memcpy row at {size}");
    }
    let store = find("store", "oneway", 8).expect("store row at 8 B");
    assert!(store["msgs_per_s"].as_f64().unwrap() > 0.0);
    assert!(find("store", "oneway", 65536).is_some(), "store row at 64 KiB");
    // The ping-pong through pins (stores and a signal word) beside the ordinary one.
    let pinned = find("shm-pinned", "pingpong", 8).expect("pinned ping-pong row");
    assert!(pinned["lat_us_p50"].as_f64().unwrap() > 0.0);
    let line = find("cacheline", "pingpong", 8).expect("cacheline row");
    assert!(line["lat_us_avg"].as_f64().unwrap() > 0.0);
    let t1: Vec<_> =
        rows.iter().filter(|r| r["pattern"] == "table1").map(|r| r["variant"].as_str().unwrap().to_string()).collect();
    assert_eq!(t1, ["baseline", "multi-channel", "batched", "combined"]);
}

// Checks that bad arguments get a clear error and a failing exit status, not a panic.
#[test]
fn bad_arguments_are_refused_clearly() {
    for (args, needle) in [
        (&["bench", "--size", "0"][..], "size"),
        (&["bench", "--size", "lots"][..], "size"),
        (&["bench", "--pattern", "sideways"][..], "pattern"),
        (&["bench", "--transport", "carrier-pigeon"][..], "transport"),
        (&["bench", "--copy-channels", "99"][..], "copy-channels"),
        (&["nodes", "--mh", "127.0.0.1:1"][..], "management host"),
        (&["demo", "--workers", "9"][..], "workers"),
        (&["bench", "vnic", "--rows", "xrack,nosuch"][..], "no row starts with \"nosuch\""),
        (&["bench", "--host-cores"][..], "--host-cores and --rows go with `bench vnic`"),
        (&["bench", "coll", "--rows", "xrack"][..], "go with `bench vnic`"),
        (&["bench", "seal", "--mtu", "1500,9000"][..], "--mtu takes one value here"),
        (&["bench", "vnic", "--mtu", "1500", "--rows", "xrack"][..], "--mtu measures its own rows"),
    ] {
        let o = rackwire(args);
        assert!(!o.status.success(), "{args:?} should fail");
        let e = stderr(&o);
        assert!(e.contains(needle), "{args:?}: stderr does not mention {needle}: {e}");
        assert!(!e.contains("panicked"), "{args:?} panicked: {e}");
    }
}

// Checks the management host as a user runs it: `rackwire mh` in its own process, a node joins
// and publishes a region, `rackwire nodes --json` and `rackwire regions --json` list them, and
// inspection with the wrong secret is refused.
#[test]
fn mh_nodes_and_regions_from_the_command_line() {
    let state = TempDir::new("cli-mh");
    let mut mh = Reaped(
        Command::new(env!("CARGO_BIN_EXE_rackwire"))
            .args(["mh", "--listen", "127.0.0.1:0", "--state", state.0.to_str().unwrap()])
            .env(rackwire::vars::SECRET, SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mh"),
    );
    let mut lines = BufReader::new(mh.0.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = loop {
        assert!(Instant::now() < deadline, "mh did not report its address");
        let line = lines.next().expect("mh output").unwrap();
        if let Some(rest) = line.strip_prefix("management host on ") {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    let fabric = rackwire::Fabric::join(rackwire::FabricConfig::new(&addr, SECRET, "cli-node")).expect("join");
    let region = fabric.alloc(8192, rackwire::Access::ALL).unwrap();
    region.publish("cli-region").unwrap();
    region.grant(fabric.id(), rackwire::Access::READ).unwrap();

    let o = rackwire(&["nodes", "--mh", &addr, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let node = v["nodes"].as_array().unwrap().iter().find(|n| n["info"]["name"] == "cli-node").expect("node listed");
    assert_eq!(node["up"], true);

    let o = rackwire(&["regions", "--mh", &addr, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = v["regions"].as_array().unwrap().iter().find(|r| r["name"] == "cli-region").expect("region listed");
    assert_eq!(r["len"], 8192);
    assert_eq!(v["grants"][0]["access"], 1);

    let table = rackwire(&["nodes", "--mh", &addr]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("cli-node"));

    let o = Command::new(env!("CARGO_BIN_EXE_rackwire"))
        .args(["nodes", "--mh", &addr])
        .env(rackwire::vars::SECRET, "wrong-secret-0123456789")
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("wrong secret"), "{}", stderr(&o));
    drop(region);
    drop(fabric);
    drop(mh);
}

// Checks the main job at small scale: `rackwire demo --quick` succeeds, says the shared counter
// was exact, ends with the sort against TCP (both outputs validated), and writes report.md,
// results.json with benchmark rows, and the pictures report.md shows, each one well-formed
// SVG document.
#[test]
fn quick_demo_writes_a_report() {
    let dir = TempDir::new("cli-demo");
    let report = dir.0.join("report");
    let o = rackwire(&[
        "demo",
        "--quick",
        "--no-peers",
        "--workers",
        "2",
        "--adds",
        "500",
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "demo failed: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("reads 1000 (expected 1000) — exact"), "{out}");
    assert!(out.contains("distributed sort, 4 ranks: fabric") && out.contains("both outputs validated"), "{out}");
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.contains("| shm | pingpong |"));
    let pictures: Vec<&str> = md
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(f, _)| f))
        .filter(|f| f.ends_with(".svg"))
        .collect();
    for must in ["latency.svg", "bandwidth.svg", "sort-phases.svg"] {
        assert!(pictures.contains(&must), "report.md does not show {must}: {pictures:?}");
    }
    for f in &pictures {
        let svg = std::fs::read_to_string(report.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{f} is not one SVG document");
        assert_eq!(svg.matches("<svg").count(), 1, "{f}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report.join("results.json")).unwrap()).unwrap();
    assert!(json["rows"].as_array().unwrap().len() >= 8);
}

/// Whether the provider is in `dir` (the workspace's build links it there); where this build
/// has libfabric's side, a missing one fails the test rather than skipping it.
fn provider_built(dir: &std::path::Path) -> bool {
    let found = dir.join("librackwire-fi.so").exists();
    assert!(found || !rackwire_fi::BUILT_WITH_LIBFABRIC, "the provider was built but is not in {}", dir.display());
    found
}

// Checks `rackwire bench ofi` end to end at tiny scale where libfabric's fi_pingpong and the
// provider (built beside this binary by the workspace build) are there: one JSON document
// with positive figures for rackwire and each of libfabric's providers, and rackwire's ratio
// against each peer.
#[test]
fn bench_ofi_measures_every_provider() {
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_rackwire")).parent().expect("bin folder").join("ofi");
    let have_tool =
        Command::new("sh").args(["-c", "command -v fi_pingpong"]).output().is_ok_and(|o| o.status.success());
    if !provider_built(&dir) || !have_tool {
        eprintln!("skipped: needs fi_pingpong (libfabric-bin) and libfabric's headers (libfabric-dev)");
        return;
    }
    let o = rackwire(&["bench", "ofi", "--repeat", "1", "--scale", "0.02", "--json"]);
    assert!(o.status.success(), "bench ofi failed: {}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    for p in ["rackwire", "shm", "tcp", "udp;ofi_rxd"] {
        assert!(doc[p]["lat_us_64b"]["median"].as_f64().unwrap() > 0.0, "{p}: {doc}");
        assert!(doc[p]["mb_s_1mib"]["median"].as_f64().unwrap() > 0.0, "{p}: {doc}");
        assert!(doc[p]["ours_over_theirs_lat"]["median"].as_f64().unwrap() > 0.0, "{p}: {doc}");
    }
}

// Checks `rackwire bench mpi` end to end at tiny scale where Open MPI and the provider are
// there: one JSON document with positive figures over rackwire, vader and tcp for each of the
// five measures, and rackwire's ratio against each.
#[test]
fn bench_mpi_measures_every_transport() {
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_rackwire")).parent().expect("bin folder").join("ofi");
    let have = |t: &str| {
        Command::new("sh").args(["-c", &format!("command -v {t}")]).output().is_ok_and(|o| o.status.success())
    };
    if !provider_built(&dir) || !have("mpirun") || !have("mpicc") {
        eprintln!("skipped: needs Open MPI (openmpi-bin, libopenmpi-dev) and libfabric's headers (libfabric-dev)");
        return;
    }
    let o = rackwire(&["bench", "mpi", "--repeat", "1", "--scale", "0.01", "--json"]);
    assert!(o.status.success(), "bench mpi failed: {}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    for key in ["pingpong_8B_us", "bw_1MiB_MBs", "put_1MiB_MBs", "allreduce_64KiB_us", "alltoallv_64KiB_us"] {
        for t in ["rackwire", "vader", "tcp", "rackwire_over_vader", "rackwire_over_tcp"] {
            assert!(doc[key][t]["median"].as_f64().unwrap() > 0.0, "{key} {t}: {doc}");
        }
    }
}

// Checks `rackwire config check`: a file with a bad type (line 2), an unknown key (line 3) and
// no secret gets one line for each, in the file's order, with its line number, and exit status
// 1; a file whose secret file others may read is refused with the fix; the same file with the
// secret file made private passes ("ok", status 0); a file that does not parse names its line.
#[test]
fn config_check_names_each_problem_on_its_line() {
    let dir = TempDir::new("config-check");
    let write = |name: &str, text: &str| {
        let p = dir.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let bad = write("bad.toml", "mh = \"127.0.0.1:7700\"\nname = 3\ncolour = \"blue\"\n");
    let o = rackwire(&["config", "check", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "one line per problem: {out}");
    assert!(lines[0].contains("bad.toml:2: name: invalid type"), "{out}");
    assert!(lines[1].contains("bad.toml:3: colour: unknown field"), "{out}");
    assert!(lines[2].contains("no secret"), "{out}");

    let secret = write("secret", "s3cret-value-0123456789\n");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let good = write("good.toml", &format!("mh = \"127.0.0.1:7700\"\nsecret_file = {:?}\n", secret));
    let o = rackwire(&["config", "check", good.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("chmod 600"), "{:?}", o);
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let o = rackwire(&["config", "check", good.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).trim_end().ends_with(": ok"));

    let broken = write("broken.toml", "mh = \"127.0.0.1:7700\"\n\nname = \"unterminated\n");
    let o = rackwire(&["config", "check", broken.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("broken.toml:3:"), "{:?}", o);
}

// Checks that one configuration file runs a host, as the packaged services use it: with only
// RACKWIRE_CONFIG set (no flags, no secret in the environment), `rackwire mh` listens where the
// file's [management_host] table says and keeps its state there; a node configured by the same
// file joins; `rackwire nodes --json` and `rackwire config check` read the file too (the node is
// listed, the file is "ok"); a bad key inside the table is named with its line.
#[test]
fn one_file_configures_the_mh_and_every_command() {
    let dir = TempDir::new("cli-one-file");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let secret = dir.0.join("secret");
    std::fs::write(&secret, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let file = dir.0.join("rackwire.toml");
    let state = dir.0.join("mh");
    std::fs::write(
        &file,
        format!(
            "mh = \"127.0.0.1:{port}\"\nsecret_file = {secret:?}\n\n[management_host]\nlisten = \"127.0.0.1:{port}\"\nstate = {state:?}\n"
        ),
    )
    .unwrap();
    let cmd = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rackwire"));
        c.args(args)
            .env(rackwire::vars::CONFIG, &file)
            .env_remove(rackwire::vars::SECRET)
            .env_remove(rackwire::vars::MH);
        c
    };
    let mut mh = Reaped(cmd(&["mh"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("start mh"));
    let mut lines = BufReader::new(mh.0.stderr.take().unwrap()).lines();
    let line = lines.find(|l| l.as_ref().map_or(true, |l| l.starts_with("management host on"))).expect("mh output");
    let line = line.unwrap();
    assert!(line.starts_with(&format!("management host on 127.0.0.1:{port} (state in {}", state.display())), "{line}");
    std::thread::spawn(move || lines.for_each(drop));

    let mut cfg = rackwire::FabricConfig::from_file(&file).unwrap();
    cfg.name = "file-node".into();
    cfg.transient = false;
    let fabric = rackwire::Fabric::join(cfg).expect("a node configured by the file joins");
    let o = cmd(&["nodes", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["nodes"].as_array().unwrap().iter().any(|n| n["info"]["name"] == "file-node"), "{v}");
    let o = cmd(&["config", "check"]).output().unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).trim_end().ends_with(": ok"), "{o:?}");
    drop(fabric);
    drop(mh);

    std::fs::write(
        &file,
        format!("mh = \"127.0.0.1:{port}\"\nsecret_file = {secret:?}\n\n[management_host]\nlisen = \"x\"\n"),
    )
    .unwrap();
    let o = cmd(&["config", "check"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("rackwire.toml:4: management_host: unknown field `lisen`"), "{out}");
}
