//! The C examples, built by the system C compiler against the generated header and the static
//! library, run as separate processes on one fabric.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use rackwire_tests::{TempDir, TestMh, SECRET};

/// The static library, as a C program links it (built once per test binary).
fn static_lib() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| rackwire_tests::build_c_forms(&["rackwire-ffi"]));
    let lib = rackwire_tests::profile_dir().join("librackwire_ffi.a");
    assert!(lib.exists(), "{} missing after building it", lib.display());
    lib
}

/// Compile `examples/c/NAME.c` into `dir`, or None (with a message) without a C compiler.
fn build(name: &str, dir: &Path) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = static_lib();
    let out = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let r = Command::new(&cc)
        .args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("crates/rackwire-ffi/include"))
        .arg(root.join(format!("examples/c/{name}.c")))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-lrt", "-o"])
        .arg(&out)
        .output();
    match r {
        Err(e) => {
            eprintln!("skipped: no C compiler ({cc}: {e})");
            None
        }
        Ok(o) => {
            assert!(o.status.success(), "{cc} {name}.c failed:\n{}", String::from_utf8_lossy(&o.stderr));
            Some(out)
        }
    }
}

fn start(exe: &Path, args: &[&str], mh: &TestMh, name: &str) -> Child {
    Command::new(exe)
        .args(args)
        .env(rackwire::vars::MH, &mh.addr)
        .env(rackwire::vars::SECRET, SECRET)
        .env(rackwire::vars::NAME, name)
        .env_remove(rackwire::vars::SECRET_FILE)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a C example")
}

fn finish(c: Child, what: &str) -> String {
    let o: Output = c.wait_with_output().expect("wait for a C example");
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{what} failed:\n{out}");
    out
}

// Checks the C ping-pong: two processes write 8 bytes with a notification into each other's
// region 2000 times; each checks every round's notification and the bytes it finds in its
// own memory through the zero-copy pointer (the program exits non-zero on any mismatch).
#[test]
fn c_pingpong_runs_between_two_processes() {
    let dir = TempDir::new("ffi-pingpong");
    let Some(exe) = build("pingpong", &dir.0) else { return };
    let mh = TestMh::start("ffi-pingpong-mh");
    let server = start(&exe, &["server", "2000"], &mh, "c-server");
    let client = start(&exe, &["client", "2000"], &mh, "c-client");
    let out = finish(client, "the client");
    finish(server, "the server");
    assert!(out.contains("pingpong 2000 rounds"), "{out}");
}

// Checks put-with-signal from C: the same two processes, each writing 8 bytes and then a
// signal word (the round number) into the other's region with rw_write_signal, and waiting
// for its own word with rw_region_wait_u64, 2000 rounds; each checks that the word is the
// round's and that the data it follows is in place (non-zero exit on any mismatch).
#[test]
fn c_pingpong_with_signals_runs_between_two_processes() {
    let dir = TempDir::new("ffi-signal");
    let Some(exe) = build("pingpong", &dir.0) else { return };
    let mh = TestMh::start("ffi-signal-mh");
    let server = start(&exe, &["server", "2000", "signal"], &mh, "c-sig-server");
    let client = start(&exe, &["client", "2000", "signal"], &mh, "c-sig-client");
    let out = finish(client, "the client");
    finish(server, "the server");
    assert!(out.contains("pingpong 2000 rounds with signals"), "{out}");
}

// Checks one-sided writes with notification from C and the error codes of refusals: a write
// before the grant is RW_STATUS_UNGRANTED, one with a forged key RW_STATUS_BAD_KEY, one after
// the revoke RW_STATUS_REVOKED, each its own code; the owner finds only the granted write in
// its memory, and the handle survives its text form.
#[test]
fn c_writes_notify_and_refusals_have_their_own_codes() {
    let dir = TempDir::new("ffi-notify");
    let Some(exe) = build("notify", &dir.0) else { return };
    let mh = TestMh::start("ffi-notify-mh");
    let owner = start(&exe, &["owner"], &mh, "c-owner");
    let writer = start(&exe, &["writer"], &mh, "c-writer");
    let w = finish(writer, "the writer");
    let o = finish(owner, "the owner");
    assert!(w.contains("writer ok"), "{w}");
    assert!(o.contains("owner ok"), "{o}");
}

// Checks every collective of the C interface across three processes, ranks of one job given
// by RACKWIRE_RANK, RACKWIRE_SIZE and RACKWIRE_JOB: bcast, scatter(v), gather(v),
// allgather(v), alltoall(v), reduce and allreduce of every element type and operation, the
// rooted ones from the last rank; each rank checks its results against ones it computes
// itself and that a root that is no rank is refused (non-zero exit on any mismatch).
#[test]
fn c_collectives_run_across_three_ranks() {
    let dir = TempDir::new("ffi-coll");
    let Some(exe) = build("collectives", &dir.0) else { return };
    let mh = TestMh::start("ffi-coll-mh");
    let ranks: Vec<Child> = (0..3)
        .map(|r| {
            let mut c = Command::new(&exe);
            c.env(rackwire::vars::MH, &mh.addr)
                .env(rackwire::vars::SECRET, SECRET)
                .env(rackwire::vars::NAME, format!("c-coll-{r}"))
                .env(rackwire::vars::RANK, r.to_string())
                .env(rackwire::vars::SIZE, "3")
                .env(rackwire::vars::JOB, "c-coll")
                .env_remove(rackwire::vars::SECRET_FILE)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c.spawn().expect("start a rank")
        })
        .collect();
    for (r, c) in ranks.into_iter().enumerate() {
        let out = finish(c, &format!("rank {r}"));
        assert!(out.contains(&format!("collectives ok {r}")), "{out}");
    }
}
