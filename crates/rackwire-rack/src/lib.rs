//! rackwire's virtual rack: a rack of hosts on one machine.
//!
//! Each host is a network namespace `rwr-<rack>-<host>`; each rail is a bridge (the switch) in
//! the switch namespace `rwr-<rack>-sw`, with one veth link per host, shaped with `tc tbf` in
//! both directions when the rail has a rate. Host `i` has address `198.18.<rail>.<i+1>/24` on
//! each rail. [`up`] then starts the management host in one host and a node agent (with the
//! virtual NIC `rw0`) in every other host that is not `remote`, and waits for them. [`down`]
//! removes everything whose name starts with the rack's prefix and the processes in it, so it
//! also cleans up after a crash. Needs root.

#![deny(unsafe_code)]

mod config;
pub mod cores;
pub mod place;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::{debug, info};

pub use config::{
    rate_bytes_per_s, HostConfig, RackConfig, RailConfig, HOSTS_MAX, HOST_NAME_MAX, RACK_NAME_MAX, RAILS_MAX,
};

/// Every namespace a rack makes starts with this.
pub const NS_PREFIX: &str = "rwr-";
/// Where racks keep their state, logs and secret (override: `RACKWIRE_RACK_DIR`).
pub const RUN_DIR: &str = "/run/rackwire/racks";
/// The management host's port.
pub const MH_PORT: u16 = 7700;
/// How long `up` waits for the management host and the agents (a rack's agents start
/// together, each joining and bringing its virtual NIC up: on a small machine busy with other
/// racks this has taken over 10 s).
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `down` gives processes to stop after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// Queue a shaped link holds, as time at its rate (`tc tbf latency`).
const TBF_LATENCY: &str = "5ms";

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum RackError {
    /// The rack description is wrong.
    #[error("rack config: {0}")]
    Config(String),
    /// Not root.
    #[error("the virtual rack needs root (network namespaces, veth links, tc)")]
    NotRoot,
    /// A rack of that name is up already.
    #[error("rack {0:?} is already up (take it down with `rackwire rack down --name {0}`)")]
    AlreadyUp(String),
    /// No such rack, or which one is meant is unclear.
    #[error("{0}")]
    NoRack(String),
    /// No such host.
    #[error("rack {rack:?} has no host {host:?} (hosts: {hosts})")]
    NoHost {
        /// Rack.
        rack: String,
        /// Asked for.
        host: String,
        /// What there is.
        hosts: String,
    },
    /// A command failed.
    #[error("`{cmd}` failed: {err}")]
    Command {
        /// The command line.
        cmd: String,
        /// What it said.
        err: String,
    },
    /// Something did not come up in time.
    #[error("{0} (see the logs in {1})")]
    NotReady(String, String),
    /// File system.
    #[error("{0}")]
    Io(String),
}

/// A host as the rack made it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostState {
    /// Host name.
    pub name: String,
    /// Its namespace.
    pub ns: String,
    /// Its address on each rail.
    pub addrs: Vec<Ipv4Addr>,
    /// A plain Ethernet host.
    pub remote: bool,
    /// Memory domain of its agent.
    pub domain: String,
    /// Its agent's (or for the management host's host, also the management host's) process ids.
    pub pids: Vec<u32>,
    /// Where its agent writes its status.
    pub status_file: Option<PathBuf>,
    /// The cores its agent and programs run on (see [`cores`]); empty: any.
    #[serde(default)]
    pub cores: Vec<usize>,
}

/// The device of rail `k` in every host.
pub fn rail_dev(k: usize) -> String {
    format!("eth{k}")
}

impl HostState {
    /// Its rail devices, comma-separated, in the order of [`HostState::links`].
    pub fn link_devs(&self) -> String {
        (0..self.addrs.len()).map(rail_dev).collect::<Vec<_>>().join(",")
    }

    /// Its rail addresses as edge-transport links (`RACKWIRE_LINKS`): each process that uses
    /// them binds ports of its own.
    pub fn links(&self) -> String {
        self.addrs.iter().map(|a| format!("{a}:0")).collect::<Vec<_>>().join(",")
    }
}

/// A rack that is up.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RackState {
    /// Its description.
    pub config: RackConfig,
    /// Its folder (state, logs, secret).
    pub dir: PathBuf,
    /// Management host address.
    pub mh: String,
    /// Secret file.
    pub secret_file: PathBuf,
    /// Hosts.
    pub hosts: Vec<HostState>,
    /// How long `up` took (ms).
    pub up_ms: u64,
}

impl RackState {
    /// A host by name.
    pub fn host(&self, name: &str) -> Result<&HostState, RackError> {
        self.hosts.iter().find(|h| h.name == name).ok_or_else(|| RackError::NoHost {
            rack: self.config.name.clone(),
            host: name.into(),
            hosts: self.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(", "),
        })
    }
}

/// Takes a rack down when dropped (for programs that bring one up for a while, also when they
/// fail half-way).
#[derive(Debug)]
pub struct DownOnDrop(pub String);

impl Drop for DownOnDrop {
    fn drop(&mut self) {
        let _ = down(Some(&self.0));
    }
}

/// What `down` removed.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DownReport {
    /// Namespaces deleted.
    pub namespaces: Vec<String>,
    /// Processes stopped.
    pub processes: usize,
    /// How long it took (ms).
    pub down_ms: u64,
}

/// One host's status.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostStatus {
    /// Host name.
    pub name: String,
    /// Namespace exists.
    pub ns_present: bool,
    /// Addresses.
    pub addrs: Vec<Ipv4Addr>,
    /// A plain Ethernet host.
    pub remote: bool,
    /// Its processes are running.
    pub running: bool,
    /// What its agent last wrote (node id, virtual NIC counters), if any.
    pub agent: Option<serde_json::Value>,
}

fn run_dir() -> PathBuf {
    std::env::var_os(rackwire::vars::RACK_DIR).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(RUN_DIR))
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Run a command; its complaint as the error.
fn run(prog: &str, args: &[&str]) -> Result<String, RackError> {
    debug!("{prog} {}", args.join(" "));
    let out = Command::new(prog).args(args).stdin(Stdio::null()).output().map_err(|e| RackError::Command {
        cmd: format!("{prog} {}", args.join(" ")),
        err: format!("cannot run {prog}: {e}"),
    })?;
    if !out.status.success() {
        return Err(RackError::Command {
            cmd: format!("{prog} {}", args.join(" ")),
            err: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The namespace of `host` (or `sw`, the switches) in `rack`.
pub fn ns_name(rack: &str, host: &str) -> String {
    format!("{NS_PREFIX}{rack}-{host}")
}

/// The namespaces that exist now, with `prefix`.
fn namespaces(prefix: &str) -> Vec<String> {
    let out = run("ip", &["netns", "list"]).unwrap_or_default();
    out.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(String::from)
        .collect()
}

/// Racks that are up (by their namespaces).
pub fn racks() -> Vec<String> {
    let mut names: Vec<String> = namespaces(NS_PREFIX)
        .iter()
        .filter_map(|n| n.strip_prefix(NS_PREFIX).and_then(|r| r.rsplit_once('-')).map(|(rack, _)| rack.to_string()))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The rack meant: `name`, or the only one up.
pub fn which(name: Option<&str>) -> Result<String, RackError> {
    if let Some(n) = name {
        return Ok(n.into());
    }
    match racks().as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(RackError::NoRack("no rack is up (start one with `rackwire rack up --config FILE`)".into())),
        many => Err(RackError::NoRack(format!("several racks are up ({}); say which with --name", many.join(", ")))),
    }
}

/// The state a rack that is up wrote.
pub fn load(name: &str) -> Result<RackState, RackError> {
    let path = run_dir().join(name).join("state.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| RackError::NoRack(format!("rack {name:?}: no state at {} ({e}); is it up?", path.display())))?;
    serde_json::from_str(&text).map_err(|e| RackError::Io(format!("{}: {e}", path.display())))
}

/// Bring the rack up: namespaces, switches, links, shaping, the management host, the agents.
/// `exe` is the `rackwire` binary the hosts run. On failure, what was made is removed.
pub fn up(cfg: &RackConfig, exe: &Path) -> Result<RackState, RackError> {
    cfg.validate()?;
    if !is_root() {
        return Err(RackError::NotRoot);
    }
    let prefix = format!("{NS_PREFIX}{}-", cfg.name);
    if !namespaces(&prefix).is_empty() {
        return Err(RackError::AlreadyUp(cfg.name.clone()));
    }
    check_cores_usable(cfg)?;
    let start = Instant::now();
    match build(cfg, exe, start) {
        Ok(s) => Ok(s),
        Err(e) => {
            let _ = down(Some(&cfg.name));
            Err(e)
        }
    }
}

/// Every core a host names is one this process may run on (and so its programs).
fn check_cores_usable(cfg: &RackConfig) -> Result<(), RackError> {
    if cfg.hosts.iter().all(|h| h.cores.is_empty()) {
        return Ok(());
    }
    let usable = cores::usable().map_err(|e| RackError::Io(format!("reading this process's cores: {e}")))?;
    for h in &cfg.hosts {
        if let Some(c) = h.cores.iter().find(|c| !usable.contains(c)) {
            return Err(RackError::Config(format!(
                "host {:?}: core {c} is not one this machine lets rackwire run on (cores {})",
                h.name,
                cores::cores_text(&usable)
            )));
        }
    }
    Ok(())
}

fn build(cfg: &RackConfig, exe: &Path, start: Instant) -> Result<RackState, RackError> {
    let rack = &cfg.name;
    let dir = run_dir().join(rack);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| RackError::Io(format!("{}: {e}", dir.display())))?;
    let secret_file = dir.join("secret");
    let secret = format!("{:032x}", rackwire_mh::auth::random_u128());
    // Readable by its owner only: nodes refuse a secret file others may read.
    let written = {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&secret_file)
            .and_then(|mut f| f.write_all(secret.as_bytes()))
    };
    written.map_err(|e| RackError::Io(format!("{}: {e}", secret_file.display())))?;

    // Switches.
    let sw = ns_name(rack, "sw");
    run("ip", &["netns", "add", &sw])?;
    for k in 0..cfg.rails.len() {
        let br = format!("br{k}");
        run("ip", &["-n", &sw, "link", "add", &br, "type", "bridge"])?;
        run("ip", &["-n", &sw, "link", "set", &br, "up"])?;
    }
    // Hosts and their links.
    let mut hosts = Vec::new();
    for (i, h) in cfg.hosts.iter().enumerate() {
        let ns = ns_name(rack, &h.name);
        run("ip", &["netns", "add", &ns])?;
        run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
        let mut addrs = Vec::new();
        for (k, rail) in cfg.rails.iter().enumerate() {
            let (dev, port) = (rail_dev(k), format!("h{i}r{k}"));
            let mtu = rail.mtu.to_string();
            run(
                "ip",
                &[
                    "link", "add", &dev, "netns", &ns, "mtu", &mtu, "type", "veth", "peer", "name", &port, "netns",
                    &sw, "mtu", &mtu,
                ],
            )?;
            run("ip", &["-n", &sw, "link", "set", &port, "master", &format!("br{k}"), "up"])?;
            let a = RackConfig::addr(i, k);
            run("ip", &["-n", &ns, "addr", "add", &format!("{a}/24"), "dev", &dev])?;
            run("ip", &["-n", &ns, "link", "set", &dev, "up"])?;
            if let Some(rate) = &rail.rate {
                let bytes = rate_bytes_per_s(rate).expect("validated");
                // The bucket holds about 1.25 ms at the rate (at least a few frames), enough
                // for the kernel's timer granularity at 10 Gbit/s.
                let burst = (bytes / 800).max(4 * rail.mtu as u64).to_string();
                for (n, d) in [(&ns, &dev), (&sw, &port)] {
                    run(
                        "tc",
                        &[
                            "-n",
                            n,
                            "qdisc",
                            "add",
                            "dev",
                            d,
                            "root",
                            "tbf",
                            "rate",
                            rate,
                            "burst",
                            &burst,
                            "latency",
                            TBF_LATENCY,
                        ],
                    )?;
                }
            }
            addrs.push(a);
        }
        hosts.push(HostState {
            name: h.name.clone(),
            ns,
            addrs,
            remote: h.remote,
            domain: h.domain.clone().unwrap_or_else(|| "rack".into()),
            pids: Vec::new(),
            status_file: None,
            cores: h.cores.clone(),
        });
    }

    // The management host, on an address of its own in rail 0's subnet: no node has it, so
    // no virtual NIC routes it, and the control plane never depends on the data plane it
    // manages. It sits on its host's loopback device (the host answers for it on rail 0), not
    // as a second address of the rail's link: software that takes one address per link (Open
    // MPI's TCP transport among them) then still sees the host's own rail address.
    let mh_name = cfg.mh_host()?.name.clone();
    let mh_i = hosts.iter().position(|h| h.name == mh_name).expect("validated");
    let mh_ip = RackConfig::mh_addr();
    run("ip", &["-n", &hosts[mh_i].ns, "addr", "add", &format!("{mh_ip}/32"), "dev", "lo"])?;
    let mh_addr = format!("{mh_ip}:{MH_PORT}");
    let mh_pid = spawn_in(
        &hosts[mh_i].ns,
        &hosts[mh_i].cores,
        exe,
        &["mh", "--listen", &mh_addr, "--state", &dir.join("mh").to_string_lossy()],
        &[(rackwire::vars::SECRET_FILE, secret_file.to_string_lossy().as_ref())],
        &dir.join("mh.log"),
    )?;
    hosts[mh_i].pids.push(mh_pid);

    // Agents.
    for (i, h) in cfg.hosts.iter().enumerate() {
        if h.remote {
            continue;
        }
        let st = &mut hosts[i];
        let status = dir.join(format!("{}.json", h.name));
        let link_mtu = cfg.frame_max().to_string();
        let mut args = vec!["agent", "--status-file"];
        let status_s = status.to_string_lossy().into_owned();
        args.push(&status_s);
        args.extend(["--link-mtu", &link_mtu]);
        if !h.vnic {
            args.push("--no-vnic");
        }
        let links_s = st.links();
        let pid = spawn_in(
            &st.ns,
            &st.cores,
            exe,
            &args,
            &[
                (rackwire::vars::MH, mh_addr.as_str()),
                (rackwire::vars::SECRET_FILE, secret_file.to_string_lossy().as_ref()),
                (rackwire::vars::NAME, h.name.as_str()),
                (rackwire::vars::LINKS, links_s.as_str()),
                (rackwire::vars::MEMORY_DOMAIN, st.domain.as_str()),
            ],
            &dir.join(format!("{}.log", h.name)),
        )?;
        st.pids.push(pid);
        st.status_file = Some(status);
    }
    let mut state = RackState { config: cfg.clone(), dir: dir.clone(), mh: mh_addr, secret_file, hosts, up_ms: 0 };
    wait_ready(&state)?;
    state.up_ms = start.elapsed().as_millis() as u64;
    let path = dir.join("state.json");
    let text = serde_json::to_string_pretty(&state).map_err(|e| RackError::Io(e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| RackError::Io(format!("{}: {e}", path.display())))?;
    info!(rack = %cfg.name, ms = state.up_ms, "rack up");
    Ok(state)
}

/// Start `exe args` in namespace `ns` on `cores` (empty: any), detached, output to `log`.
fn spawn_in(
    ns: &str,
    cores: &[usize],
    exe: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    log: &Path,
) -> Result<u32, RackError> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(log).map_err(|e| RackError::Io(format!("{}: {e}", log.display())))?;
    let err = out.try_clone().map_err(|e| RackError::Io(e.to_string()))?;
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(exe).args(args).stdin(Stdio::null()).stdout(out).stderr(err).process_group(0);
    for (k, v) in env {
        c.env(k, v);
    }
    let child = cores::on_cores(cores, || c.spawn()).and_then(|r| r).map_err(|e| RackError::Command {
        cmd: format!("ip netns exec {ns} {} {}", exe.display(), args.join(" ")),
        err: e.to_string(),
    })?;
    Ok(child.id())
}

/// Wait until every agent says it is ready (it joined and its virtual NIC is up).
fn wait_ready(state: &RackState) -> Result<(), RackError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    for h in &state.hosts {
        let Some(f) = &h.status_file else { continue };
        loop {
            let ready = std::fs::read_to_string(f)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|v| v.get("ready").and_then(|r| r.as_bool()) == Some(true));
            if ready {
                break;
            }
            if h.pids.iter().all(|&p| !alive(p)) {
                return Err(RackError::NotReady(
                    format!("the agent of host {} exited", h.name),
                    state.dir.display().to_string(),
                ));
            }
            if Instant::now() > deadline {
                return Err(RackError::NotReady(
                    format!("the agent of host {} was not ready within {READY_TIMEOUT:?}", h.name),
                    state.dir.display().to_string(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped by its parent) counts as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z"),
        Err(_) => false,
    }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// Take a rack down (`None`: the only one up; with `all`, every rack): stop every process in
/// its namespaces, delete the namespaces (and with them the links, switches and routes), remove
/// its folder. Finds what to remove by name prefix, so it works after a crash too.
pub fn down(name: Option<&str>) -> Result<DownReport, RackError> {
    if !is_root() {
        return Err(RackError::NotRoot);
    }
    let start = Instant::now();
    let rack = which(name)?;
    let prefix = format!("{NS_PREFIX}{rack}-");
    let nss = namespaces(&prefix);
    let mut report = DownReport::default();
    let mut pids = Vec::new();
    for ns in &nss {
        let out = run("ip", &["netns", "pids", ns]).unwrap_or_default();
        pids.extend(out.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    // Agents and management hosts as recorded, in case a namespace is already gone.
    if let Ok(s) = load(&rack) {
        pids.extend(s.hosts.iter().flat_map(|h| h.pids.iter().copied()));
    }
    pids.sort();
    pids.dedup();
    pids.retain(|&p| alive(p));
    for &p in &pids {
        signal(p, rustix::process::Signal::TERM);
    }
    let deadline = Instant::now() + STOP_GRACE;
    while pids.iter().any(|&p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    for &p in pids.iter().filter(|&&p| alive(p)) {
        signal(p, rustix::process::Signal::KILL);
    }
    report.processes = pids.len();
    for ns in nss {
        run("ip", &["netns", "del", &ns])?;
        report.namespaces.push(ns);
    }
    let _ = std::fs::remove_dir_all(run_dir().join(&rack));
    report.down_ms = start.elapsed().as_millis() as u64;
    info!(rack = %rack, ms = report.down_ms, "rack down");
    Ok(report)
}

/// Every host's status.
pub fn status(name: Option<&str>) -> Result<(RackState, Vec<HostStatus>), RackError> {
    let rack = which(name)?;
    let state = load(&rack)?;
    let present = namespaces(&format!("{NS_PREFIX}{rack}-"));
    let hosts = state
        .hosts
        .iter()
        .map(|h| HostStatus {
            name: h.name.clone(),
            ns_present: present.contains(&h.ns),
            addrs: h.addrs.clone(),
            remote: h.remote,
            running: !h.pids.is_empty() && h.pids.iter().all(|&p| alive(p)),
            agent: h
                .status_file
                .as_ref()
                .and_then(|f| std::fs::read_to_string(f).ok())
                .and_then(|t| serde_json::from_str(&t).ok()),
        })
        .collect();
    Ok((state, hosts))
}

/// What a rackwire program started in `host` needs to join the rack's fabric as a node of
/// that host: the management host, the secret, the host's rail addresses (each process binds
/// its own ports) and largest frame, and the host's memory domain.
pub fn program_env(state: &RackState, host: &HostState) -> Vec<(String, String)> {
    vec![
        (rackwire::vars::MH.into(), state.mh.clone()),
        (rackwire::vars::SECRET_FILE.into(), state.secret_file.to_string_lossy().into_owned()),
        (rackwire::vars::LINKS.into(), host.links()),
        (rackwire::vars::LINK_MTU.into(), state.config.frame_max().to_string()),
        // The rail devices, in the order of the links: a program that must reach the other
        // hosts over Ethernet (not through rw0, which routes their addresses over the
        // fabric) binds its sockets to them.
        (rackwire::vars::LINK_DEVS.into(), host.link_devs()),
        (rackwire::vars::MEMORY_DOMAIN.into(), host.domain.clone()),
    ]
}

/// A program to run in a host of a rack, on that host's cores.
pub struct HostCommand {
    /// The command (`ip netns exec` into the host), with the host's environment.
    pub command: Command,
    /// The host's cores (empty: any).
    pub cores: Vec<usize>,
}

impl HostCommand {
    /// Run it on the host's cores and wait for it.
    pub fn status(&mut self) -> std::io::Result<std::process::ExitStatus> {
        let command = &mut self.command;
        cores::on_cores(&self.cores, || command.status()).and_then(|r| r)
    }
}

/// A command that runs `cmd` in `host` of the rack (`None`: the only one up).
pub fn exec_command(name: Option<&str>, host: &str, cmd: &[String]) -> Result<HostCommand, RackError> {
    if cmd.is_empty() {
        return Err(RackError::Config("nothing to run: give the command after `--`".into()));
    }
    let rack = which(name)?;
    let ns = ns_name(&rack, host);
    if !namespaces(&ns).contains(&ns) {
        let hosts = load(&rack).map(|s| s.hosts.iter().map(|h| h.name.clone()).collect::<Vec<_>>().join(", "));
        return Err(RackError::NoHost { rack, host: host.into(), hosts: hosts.unwrap_or_default() });
    }
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &ns]).args(cmd);
    let mut cores = Vec::new();
    if let Ok(s) = load(&rack) {
        // Programs run in a host find its fabric, links and memory domain without being told,
        // and run on its cores.
        if let Ok(h) = s.host(host) {
            c.envs(program_env(&s, h));
            cores = h.cores.clone();
        }
    }
    Ok(HostCommand { command: c, cores })
}
