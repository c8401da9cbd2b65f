//! What the provider's integration tests share: where the provider is, whether a tool is
//! installed, running a program with a time limit.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The folder libfabric loads the provider from (`target/<profile>/ofi`), or none where this
/// build has no libfabric side (no headers: nothing to load, the tests skip). With one, a
/// missing library fails the test: a test of the provider must never pass by skipping.
pub fn provider_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?.join("ofi");
    let found = dir.join("librackwire-fi.so").exists();
    assert!(found || !rackwire_fi::BUILT_WITH_LIBFABRIC, "the provider was built but is not in {}", dir.display());
    found.then_some(dir)
}

/// Whether `tool` is on the path.
pub fn have(tool: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success())
}

/// Run `cmd` to its end, killing it after `limit` at most.
pub fn run(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

/// What a program printed, standard output then standard error.
pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The environment of a process joining the fabric of the management host at `mh` with
/// `secret` (the provider found in `dir`), over the edge transport with `edge` (two loopback
/// links) or shared memory, named `name` (or, without one, after its process id: a program
/// that forks, or a job's ranks, need that).
pub fn fabric_env(cmd: &mut Command, dir: &Path, mh: &str, secret: &str, name: Option<&str>, edge: bool) {
    cmd.env("FI_PROVIDER_PATH", dir)
        .env(rackwire::vars::MH, mh)
        .env(rackwire::vars::SECRET, secret)
        .env(rackwire::vars::CONFIG, "");
    cmd.env(rackwire::vars::STATE_DIR, rackwire_tests::state_dir());
    match name {
        Some(n) => cmd.env(rackwire::vars::NAME, n),
        None => cmd.env_remove(rackwire::vars::NAME),
    };
    if edge {
        cmd.env(rackwire::vars::TRANSPORT, "edge").env(rackwire::vars::LINKS, "127.0.0.1:0,127.0.0.1:0");
    } else {
        cmd.env_remove(rackwire::vars::TRANSPORT).env_remove(rackwire::vars::LINKS);
    }
}
