//! The provider as libfabric's programs load it: `fi_info` lists it, Debian's `fi_pingpong`
//! runs over it, and a C program of ours checks libfabric's API call by call (`tests/c`).
//! Each runs over shared memory and over the edge transport (two loopback links). Without
//! libfabric's tools or headers (Debian: libfabric-bin, libfabric-dev) the tests say so and
//! skip.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{have, provider_dir, run, text};
use rackwire_tests::{TempDir, TestMh, SECRET};

/// Everything the tests need, or why they skip.
fn setup(tools: &[&str]) -> Option<PathBuf> {
    let Some(dir) = provider_dir() else {
        eprintln!("skipped: the provider was built without libfabric's headers (install libfabric-dev)");
        return None;
    };
    if let Some(t) = tools.iter().find(|t| !have(t)) {
        eprintln!("skipped: {t} is missing (install libfabric-bin)");
        return None;
    }
    Some(dir)
}

/// The environment of a process on the fabric of `mh`, over `edge` or shared memory, named
/// `name` (or, without one, after its process id: a program that forks needs that).
fn fabric_env(cmd: &mut Command, dir: &Path, mh: &TestMh, name: Option<&str>, edge: bool) {
    common::fabric_env(cmd, dir, &mh.addr, SECRET, name, edge);
    cmd.env("FI_PROVIDER", "rackwire");
}

/// A loopback TCP port free now (fi_pingpong's control connection).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

// Checks that libfabric finds the provider where FI_PROVIDER_PATH says and lists it with an
// RDM endpoint; and that a process not configured for a fabric (no RACKWIRE_MH) is offered
// nothing by it, so fi_info fails rather than listing a provider that cannot work.
#[test]
fn fi_info_lists_the_provider_only_where_a_fabric_is_configured() {
    let Some(dir) = setup(&["fi_info"]) else { return };
    let mh = TestMh::start("ofi-info");
    let mut cmd = Command::new("fi_info");
    cmd.args(["-p", "rackwire"]);
    fabric_env(&mut cmd, &dir, &mh, Some("ofi-info"), false);
    let o = run(cmd, Duration::from_secs(30));
    let out = text(&o);
    assert!(o.status.success() && out.contains("provider: rackwire") && out.contains("FI_EP_RDM"), "{out}");
    let mut bare = Command::new("fi_info");
    bare.args(["-p", "rackwire"])
        .env("FI_PROVIDER_PATH", &dir)
        .env_remove(rackwire::vars::MH)
        .env(rackwire::vars::CONFIG, "");
    let o = run(bare, Duration::from_secs(30));
    assert!(!o.status.success(), "offered without a fabric: {}", text(&o));
}

/// fi_pingpong's server and client over the provider, checking every byte (`-v`).
fn pingpong(dir: &Path, mh: &TestMh, mode: &str, edge: bool) {
    let port = free_port().to_string();
    let args = ["-p", "rackwire", "-e", "rdm", "-m", mode, "-v", "-I", "200"];
    let mut server = Command::new("fi_pingpong");
    server.args(args).args(["-B", &port]);
    fabric_env(&mut server, dir, mh, Some(&format!("pp-server-{mode}")), edge);
    let server = std::thread::spawn(move || run(server, Duration::from_secs(120)));
    std::thread::sleep(Duration::from_millis(300));
    let mut client = Command::new("fi_pingpong");
    client.args(args).args(["-P", &port, "127.0.0.1"]);
    fabric_env(&mut client, dir, mh, Some(&format!("pp-client-{mode}")), edge);
    let c = run(client, Duration::from_secs(120));
    let s = server.join().expect("server thread");
    let (cout, sout) = (text(&c), text(&s));
    assert!(
        c.status.success() && s.status.success(),
        "{mode} over {}:\nclient:\n{cout}\nserver:\n{sout}",
        if edge { "edge" } else { "shm" }
    );
    for size in ["64", "1k", "64k", "1m"] {
        assert!(cout.lines().any(|l| l.starts_with(size) && l.contains("=200")), "no {size} row in:\n{cout}");
    }
}

// Checks Debian's fi_pingpong (libfabric's own test program) between two processes over the
// provider, plain and tagged messages from 64 B to 1 MiB, each byte verified by the program
// (-v), over shared memory and over the edge transport: both ends exit 0 and print a row
// for every size.
#[test]
fn fi_pingpong_runs_over_the_provider() {
    let Some(dir) = setup(&["fi_pingpong"]) else { return };
    let mh = TestMh::start("ofi-pingpong");
    for edge in [false, true] {
        for mode in ["msg", "tagged"] {
            pingpong(&dir, &mh, mode, edge);
        }
    }
}

// Checks libfabric's API over the provider with tests/c/ofi_check.c (each check is listed
// at its top): getinfo's refusals, messages with data and source, the unexpected path,
// 3 MiB messages, truncation, peek and claim, cancel, ignore bits, inject, counters, bad use,
// a peer that left; over shared memory and over the edge transport. Both of its processes
// must say "ok".
#[test]
fn libfabric_api_checks_pass_over_the_provider() {
    let Some(dir) = setup(&["cc"]) else { return };
    let build = TempDir::new("ofi-check");
    let exe = build.0.join("ofi_check");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/ofi_check.c");
    let cc = Command::new("cc")
        .args(["-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg(&src)
        .args(["-lfabric", "-o"])
        .arg(&exe)
        .output()
        .expect("cc");
    assert!(cc.status.success(), "building ofi_check.c:\n{}", text(&cc));
    let mh = TestMh::start("ofi-check");
    for edge in [false, true] {
        let mut cmd = Command::new(&exe);
        fabric_env(&mut cmd, &dir, &mh, None, edge);
        let o = run(cmd, Duration::from_secs(120));
        let out = text(&o);
        assert!(
            o.status.success() && out.contains("sender ok") && out.contains("receiver ok"),
            "over {}:\n{out}",
            if edge { "edge" } else { "shm" }
        );
    }
}
