//! Helpers for the multi-process tests: a management host in the test process and test nodes
//! (the `rw-testnode` binary) in processes of their own, driven line by line.

#![deny(unsafe_code)]

pub mod collcheck;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

/// The secret the tests' fabrics use.
pub const SECRET: &str = "test-fabric-secret";
/// How long a test waits for one answer from a node before it fails.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// The stable short name of an error kind, as `rw-testnode` prints it.
pub fn error_kind(e: &rackwire::Error) -> &'static str {
    use rackwire::Error as E;
    match e {
        E::Ungranted { .. } => "ungranted",
        E::Revoked { .. } => "revoked",
        E::OutOfBounds { .. } => "out_of_bounds",
        E::Misaligned { .. } => "misaligned",
        E::BadKey { .. } => "bad_key",
        E::UnknownRegion { .. } => "unknown_region",
        E::UnknownPeer(_) => "unknown_peer",
        E::PeerGone(_) => "peer_gone",
        E::Unreachable { .. } => "unreachable",
        E::Timeout => "timeout",
        E::MessageTooLarge { .. } => "message_too_large",
        E::Limit(_) => "limit",
        E::BadHandle(_) => "bad_handle",
        E::Protocol(_) => "protocol",
        E::Config(_) => "config",
        E::Mh(m) if m.denied => "denied",
        E::Mh(_) => "mh",
        E::Sys { .. } => "sys",
        E::Closed => "closed",
        E::Busy { .. } => "busy",
    }
}

/// Where this test process's nodes keep their state (key pairs, the management hosts' keys
/// pinned on first use): a folder of its own. A shared one (the user's) would take another
/// run's management host that happened to get the same address and port for one whose key
/// changed, and refuse it (and the tests would pile pins into the user's home).
pub fn state_dir() -> PathBuf {
    std::env::temp_dir().join(format!("rackwire-test-state-{}", std::process::id()))
}

/// A fabric node in this process, for tests that run several nodes as threads: it reaches its
/// peers over shared memory, or with `edge` over the edge transport on a loopback link.
pub fn thread_node(mh: &rackwire::MhHandle, secret: &str, name: &str, edge: bool) -> rackwire::Fabric {
    let mut cfg = rackwire::FabricConfig::new(mh.addr().to_string(), secret, name.to_string());
    cfg.state_dir = Some(state_dir());
    if edge {
        cfg.transport = rackwire::TransportChoice::Edge;
        cfg.links = vec!["127.0.0.1:0".into()];
    }
    rackwire::Fabric::join(cfg).expect("join")
}

/// Run `body` as every rank of an `n`-rank job named `job` whose ranks are threads of this
/// process, each with a fabric node of its own (see [`thread_node`]) and its group (waiting at
/// most `timeout` for the others in a group call), under a management host of its own that
/// goes when they end; each rank's result.
pub fn thread_ranks<E>(
    secret: &str,
    job: &str,
    n: usize,
    edge: bool,
    timeout: Duration,
    body: impl Fn(rackwire_coll::Group) -> Result<(), E> + Send + Sync + 'static,
) -> Vec<Result<(), E>>
where
    E: From<rackwire_coll::CollError> + Send + 'static,
{
    let mh = rackwire::ManagementHost::start("127.0.0.1:0", None, secret.as_bytes()).expect("management host");
    let body = std::sync::Arc::new(body);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let fabric = std::sync::Arc::new(thread_node(&mh, secret, &format!("{job}-{rank}"), edge));
            let (job, body) = (job.to_string(), body.clone());
            std::thread::spawn(move || {
                let config = rackwire_coll::GroupConfig { timeout, job_token: None };
                body(rackwire_coll::Group::join_with(fabric, &job, rank, n, config)?)
            })
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect();
    drop(mh);
    out
}

/// A management host and two nodes in this process (see [`thread_node`]) called `rx_name`
/// and `tx_name`, over the edge transport with `edge`, and the second's connection to the
/// first. The host comes first: bound in that order, it goes last.
pub fn thread_pair(
    secret: &str,
    rx_name: &str,
    tx_name: &str,
    edge: bool,
) -> (rackwire::MhHandle, rackwire::Fabric, rackwire::Fabric, rackwire::Conn) {
    let mh = rackwire::ManagementHost::start("127.0.0.1:0", None, secret.as_bytes()).expect("management host");
    let rx = thread_node(&mh, secret, rx_name, edge);
    let tx = thread_node(&mh, secret, tx_name, edge);
    let conn = tx.connect(rx.id()).expect("connect");
    (mh, rx, tx, conn)
}

/// The standard output of a command that must have succeeded (else the test fails showing
/// both of its outputs).
pub fn succeeded(o: &std::process::Output) -> String {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A child process killed and waited for when the test is done with it, or fails.
pub struct Reaped(pub std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A folder for one test's state, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new empty folder named after `tag`.
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "rw-test-{tag}-{}-{:x}",
            std::process::id(),
            rackwire_mh::auth::random_u128() as u32
        ));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A management host for one test.
pub struct TestMh {
    /// The running host (None while "down").
    pub handle: Option<rackwire::MhHandle>,
    /// Its address.
    pub addr: String,
    /// Its state folder.
    pub state: TempDir,
}

impl TestMh {
    /// Start one on a free loopback port with a fresh state folder.
    pub fn start(tag: &str) -> Self {
        let state = TempDir::new(tag);
        let h = rackwire::ManagementHost::start("127.0.0.1:0", Some(&state.0), SECRET.as_bytes())
            .expect("start management host");
        TestMh { addr: h.addr().to_string(), handle: Some(h), state }
    }

    /// Stop it (state stays on disk).
    pub fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.stop();
        }
    }

    /// Start it again on the same address and state.
    pub fn restart(&mut self) {
        self.stop();
        let h = rackwire::ManagementHost::start(&self.addr, Some(&self.state.0), SECRET.as_bytes())
            .expect("restart management host");
        self.handle = Some(h);
    }

    /// An observer session, for inspection.
    pub fn observer(&self) -> rackwire_mh::MhClient {
        rackwire_mh::MhClient::join(rackwire_mh::MhConfig {
            addr: self.addr.clone(),
            secret: SECRET.as_bytes().to_vec(),
            name: "test-observer".into(),
            role: rackwire_mh::Role::Observer,
            trust: rackwire_mh::MhTrust::Secret,
            transient: false,
        })
        .expect("observer joins")
    }
}

/// Where `rw-testnode` is: beside the test executable's `deps` folder, as cargo lays out a
/// target folder (`RW_TESTNODE` overrides).
pub fn testnode_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("RW_TESTNODE") {
        return PathBuf::from(p);
    }
    sibling_bin("rw-testnode")
}

/// Where `rw-collcheck` (a rank of a test job) is, as [`testnode_bin`] finds its binary.
pub fn collcheck_bin() -> PathBuf {
    sibling_bin("rw-collcheck")
}

fn sibling_bin(name: &str) -> PathBuf {
    profile_dir().join(name)
}

/// The target profile folder a test runs from (`target/<profile>`): beside the test
/// executable's `deps` folder, as cargo lays out a target folder.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe folder");
    if dir.ends_with("deps") { dir.parent().expect("target profile folder") } else { dir }.to_path_buf()
}

/// Build the C forms of the library crates `packages` (their `cdylib` and `staticlib`) into
/// [`profile_dir`], with the same cargo and profile as the running test: `cargo test` builds
/// only a crate's Rust form for its tests, so a test of the C library or of the package makes
/// the rest itself. Panics with cargo's message when the build fails.
pub fn build_c_forms(packages: &[&str]) {
    let mut cargo = std::process::Command::new(env!("CARGO"));
    cargo.args(["build", "--quiet", "--lib"]);
    for p in packages {
        cargo.args(["-p", p]);
    }
    if profile_dir().file_name().is_some_and(|p| p == "release") {
        cargo.arg("--release");
    }
    let o = cargo.output().expect("run cargo");
    assert!(o.status.success(), "building {packages:?} failed:\n{}", String::from_utf8_lossy(&o.stderr));
}

/// Which transport the test nodes use between each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Shared memory (the default: the nodes share this machine).
    Shm,
    /// The edge transport over two loopback links, forced even though memory is shared.
    Edge,
}

impl Transport {
    /// `RW_TEST_TRANSPORT=edge` runs the multi-process tests over the edge transport.
    pub fn from_env() -> Self {
        match std::env::var("RW_TEST_TRANSPORT").as_deref() {
            Ok("edge") => Transport::Edge,
            _ => Transport::Shm,
        }
    }

    fn edge_env(self) -> Option<[(&'static str, &'static str); 2]> {
        (self == Transport::Edge)
            .then_some([(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "127.0.0.1:0,127.0.0.1:0")])
    }
}

/// A test node in its own process.
pub struct Node {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Its node id.
    pub id: u32,
    /// Its name.
    pub name: String,
}

impl Node {
    /// Start `rw-testnode` as `name`, joined to `mh` with `secret`. Panics unless it joins.
    pub fn spawn(mh: &str, name: &str) -> Node {
        let mut n = Node::spawn_with_secret(mh, name, SECRET);
        let ready = n.line();
        let id = ready.strip_prefix("ready ").unwrap_or_else(|| panic!("{name} did not join: {ready}"));
        n.id = id.parse().expect("node id");
        n
    }

    /// Start `name` with extra environment (for example a transport or faults), and wait
    /// for it to join.
    pub fn spawn_env(mh: &str, name: &str, env: &[(&str, &str)]) -> Node {
        let mut n = Node::spawn_inner(mh, name, SECRET, env);
        let ready = n.line();
        let id = ready.strip_prefix("ready ").unwrap_or_else(|| panic!("{name} did not join: {ready}"));
        n.id = id.parse().expect("node id");
        n
    }

    /// Start it with any secret, without waiting for it to join.
    pub fn spawn_with_secret(mh: &str, name: &str, secret: &str) -> Node {
        Node::spawn_inner(mh, name, secret, &[])
    }

    fn spawn_inner(mh: &str, name: &str, secret: &str, env: &[(&str, &str)]) -> Node {
        Node::spawn_cmd(Command::new(testnode_bin()), mh, name, secret, env)
    }

    /// Start `name` inside network namespace `ns` and wait for it to join. Its state (the
    /// management hosts' keys it pins) is the namespace's own: every namespaced test's
    /// management host listens on the same address, often on the same port, with a key of
    /// its own, and a pin from another test would refuse it.
    pub fn spawn_in_netns(ns: &str, mh: &str, name: &str, env: &[(&str, &str)]) -> Node {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(testnode_bin());
        let dir = state_dir().join(format!("netns-{ns}")).to_string_lossy().into_owned();
        let mut all: Vec<(&str, &str)> = vec![(rackwire::vars::STATE_DIR, &dir)];
        all.extend_from_slice(env);
        let mut n = Node::spawn_cmd(cmd, mh, name, SECRET, &all);
        let ready = n.line();
        let id = ready.strip_prefix("ready ").unwrap_or_else(|| panic!("{name} did not join: {ready}"));
        n.id = id.parse().expect("node id");
        n
    }

    /// A management host run by `rw-testnode mh ADDR` inside namespace `ns`; its address.
    pub fn mh_in_netns(ns: &str, addr: &str) -> (Node, String) {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(testnode_bin()).args(["mh", addr]);
        let mut n = Node::spawn_cmd(cmd, "", "mh", SECRET, &[]);
        let line = n.line();
        let addr = line
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("management host did not start: {line}"))
            .to_string();
        (n, addr)
    }

    fn spawn_cmd(mut cmd: Command, mh: &str, name: &str, secret: &str, env: &[(&str, &str)]) -> Node {
        if let Some(t) = Transport::from_env().edge_env() {
            cmd.envs(t);
        }
        cmd.env(rackwire::vars::STATE_DIR, state_dir());
        // The caller's environment wins over the suite-wide transport.
        cmd.envs(env.iter().copied());
        let mut child = cmd
            .env(rackwire::vars::MH, mh)
            .env(rackwire::vars::SECRET, secret)
            .env(rackwire::vars::NAME, name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn rw-testnode");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Node { child, stdin, lines, id: 0, name: name.into() }
    }

    /// The next line the node prints.
    pub fn line(&mut self) -> String {
        self.lines.recv_timeout(ANSWER_TIMEOUT).unwrap_or_else(|_| panic!("node {} gave no answer in time", self.name))
    }

    /// Send a command without waiting for its answer.
    pub fn start_cmd(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").and_then(|_| self.stdin.flush()).expect("write to node");
    }

    /// Run one command and return its one-line answer.
    pub fn cmd(&mut self, cmd: &str) -> String {
        self.start_cmd(cmd);
        self.line()
    }

    /// Run a command that must answer `ok ...`; returns what follows `ok`.
    pub fn ok(&mut self, cmd: &str) -> String {
        let a = self.cmd(cmd);
        match a.strip_prefix("ok") {
            Some(rest) => rest.trim().to_string(),
            None => panic!("{}: `{cmd}` answered `{a}`", self.name),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kill the process at once.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Wait for the process to exit; its exit status.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("wait for node")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test pattern: byte `i` of a stream written from offset `off` with `seed`.
pub fn pattern(seed: u64, off: u64, len: usize) -> Vec<u8> {
    (off..off + len as u64).map(|i| (i.wrapping_mul(31) ^ (i >> 12) ^ seed) as u8).collect()
}

/// Lower-case hex of bytes.
pub fn hex(b: &[u8]) -> String {
    rackwire_mh::auth::to_hex(b)
}

/// This process runs as root (tests of namespaces, and of what only root may do, need it).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}
