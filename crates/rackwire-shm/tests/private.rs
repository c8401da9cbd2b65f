//! Other processes cannot reach a node's windows behind its back: a peer given a read-only
//! descriptor cannot reopen it for writing, and another process of the same user cannot open
//! the node's descriptors through `/proc/<pid>/fd`.
//!
//! The processes involved are this test binary run again in a child role. When the tests run
//! as root (which may override file modes and open any process's descriptors), the children
//! run as an unprivileged user (uid and gid 65534, through util-linux's `setpriv`), all as the
//! same one, which is the case the protections are for.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use rackwire_shm::SharedMem;
use rustix::fs::{Mode, OFlags};

/// The child role this process plays, if any.
const ROLE: &str = "RW_PRIVATE_TEST_ROLE";
/// For the owner role: stay dumpable (the control case, without the protection).
const DUMPABLE: &str = "RW_PRIVATE_TEST_DUMPABLE";
/// For the probing roles: the path to open, or the descriptor inherited.
const TARGET: &str = "RW_PRIVATE_TEST_TARGET";
/// Lines a child reports on start with this.
const RESULT: &str = "RESULT:";

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// This test binary, copied where an unprivileged user may run it.
struct Binary {
    dir: PathBuf,
    exe: PathBuf,
}

impl Binary {
    fn new(tag: &str) -> Binary {
        let dir = std::env::temp_dir().join(format!("rw-private-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("probe");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        Binary { dir, exe }
    }

    /// A child running test `test` in role `role`, unprivileged when this process is root.
    fn child(&self, test: &str, role: &str) -> Command {
        let mut c = if is_root() {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(&self.exe);
            c
        } else {
            Command::new(&self.exe)
        };
        c.args([test, "--exact", "--nocapture", "--test-threads=1"]).env(ROLE, role);
        c
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a child reported (its `RESULT:` line).
fn result_of(out: &[u8]) -> String {
    let text = String::from_utf8_lossy(out);
    text.lines().find_map(reported).unwrap_or_else(|| text.into())
}

/// A child's report in one line of its output (the test harness may have written the
/// test's name ahead of it on the same line).
fn reported(line: &str) -> Option<String> {
    line.split_once(RESULT).map(|(_, r)| r.trim().to_string())
}

fn report(s: &str) {
    println!("{RESULT} {s}");
    std::io::stdout().flush().unwrap();
}

/// Open `path` with `flags`: "opened" or "refused (errno)".
fn try_open(path: &str, flags: OFlags) -> String {
    match rustix::fs::open(path, flags | OFlags::CLOEXEC, Mode::empty()) {
        Ok(_) => "opened".into(),
        Err(e) => format!("refused ({e})"),
    }
}

fn setpriv_missing() -> bool {
    is_root() && Command::new("setpriv").arg("--version").output().is_err()
}

// Checks that a peer holding a read-only descriptor of a window cannot make it writable by
// reopening it through /proc/self/fd with O_RDWR (the memfd's mode was 0777, so the kernel
// allowed it): a child process is handed the descriptor (inherited) and tries. It can still
// read through the descriptor it was given.
#[test]
fn a_read_only_descriptor_cannot_be_reopened_for_writing() {
    const TEST: &str = "a_read_only_descriptor_cannot_be_reopened_for_writing";
    if std::env::var(ROLE).as_deref() == Ok("reopen") {
        let fd = std::env::var(TARGET).unwrap();
        let rw = try_open(&format!("/proc/self/fd/{fd}"), OFlags::RDWR);
        // The inherited descriptor still reads the window's first byte.
        let n: i32 = fd.parse().unwrap();
        // SAFETY: the parent left this descriptor open across exec for this process, and it
        // stays open for the borrow's life (the process exits right after).
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(n) };
        let mut b = [0u8; 1];
        let read = rustix::io::pread(borrowed, &mut b, 0).map(|_| b[0]);
        report(&format!("rw={rw} read={read:?}"));
        std::process::exit(0);
    }
    if setpriv_missing() {
        eprintln!("skipped: running as root needs util-linux's setpriv to act as an unprivileged user");
        return;
    }
    let win = SharedMem::create("reopen-test", 4096).unwrap();
    // SAFETY: the window is 4096 bytes and nothing else touches it.
    unsafe { win.as_ptr().write(0x5a) };
    let ro = win.readonly_fd().unwrap();
    // A duplicate without close-on-exec, for the child to inherit.
    let inherit = rustix::io::dup(&ro).unwrap();
    let bin = Binary::new("reopen");
    let out = bin
        .child(TEST, "reopen")
        .env(TARGET, inherit.as_raw_fd().to_string())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    drop(inherit);
    let got = result_of(&out.stdout);
    assert!(got.starts_with("rw=refused"), "the write reopen must be refused: {got}");
    assert!(got.ends_with("read=Ok(90)"), "the read-only descriptor still reads: {got}");
}

// Checks that another process of the same user cannot open a node's descriptors through
// /proc/<pid>/fd once the node keeps them private (it is not dumpable), and that the same
// probe does open them when it does not (so the probe would catch the hole): an owner child
// creates a window and reports its pid and descriptor, a prober child tries to open it.
#[test]
fn another_process_cannot_open_a_nodes_descriptors_through_proc() {
    const TEST: &str = "another_process_cannot_open_a_nodes_descriptors_through_proc";
    match std::env::var(ROLE).as_deref() {
        Ok("owner") => {
            if std::env::var(DUMPABLE).is_err() {
                rackwire_shm::keep_descriptors_private().unwrap();
            }
            let win = SharedMem::create("private-test", 4096).unwrap();
            report(&format!("/proc/{}/fd/{}", std::process::id(), win.fd().as_raw_fd()));
            // Until the parent is done probing.
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0);
        }
        Ok("prober") => {
            report(&try_open(&std::env::var(TARGET).unwrap(), OFlags::RDONLY));
            std::process::exit(0);
        }
        _ => {}
    }
    if setpriv_missing() {
        eprintln!("skipped: running as root needs util-linux's setpriv to act as an unprivileged user");
        return;
    }
    let bin = Binary::new("proc");
    let probe = |dumpable: bool| {
        let mut owner = bin.child(TEST, "owner");
        if dumpable {
            owner.env(DUMPABLE, "1");
        }
        let mut owner = owner.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
        // Read on another thread, so a child that never reports fails the test by its
        // timeout instead of hanging it.
        let stdout = owner.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let found = BufReader::new(stdout).lines().map_while(Result::ok).find_map(|l| reported(&l));
            let _ = tx.send(found);
        });
        let path = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .ok()
            .flatten()
            .expect("the owner reports its descriptor within 30 s");
        let out = bin.child(TEST, "prober").env(TARGET, &path).stderr(Stdio::inherit()).output().unwrap();
        drop(owner.stdin.take());
        owner.wait().unwrap();
        result_of(&out.stdout)
    };
    let open = probe(true);
    assert_eq!(open, "opened", "control: a dumpable owner's descriptor opens (the probe works)");
    let closed = probe(false);
    assert!(closed.starts_with("refused"), "a private owner's descriptor is refused: {closed}");
}
