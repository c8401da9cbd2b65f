//! How a node finds and proves itself to its fabric.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::{Error, OP_TIMEOUT_DEFAULT, PEER_TIMEOUT_DEFAULT};

/// Default busy-poll time of a waiting receiver.
pub const BUSY_POLL_DEFAULT: Duration = Duration::from_micros(200);

/// Which transport reaches peers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportChoice {
    /// Shared memory for peers on this machine, the edge transport for the rest.
    #[default]
    Auto,
    /// Shared memory only; peers elsewhere are unreachable.
    Shm,
    /// The edge transport for every peer, even those sharing memory (for tests and
    /// measurements of the edge transport on one machine).
    Edge,
}

/// A node's configuration.
///
/// Sources, later ones overriding earlier: a TOML file (`RACKWIRE_CONFIG` or
/// [`FabricConfig::from_file`]), then the environment (`RACKWIRE_MH` — one address, or several
/// comma-separated for management hosts on etcd — `RACKWIRE_SECRET`, `RACKWIRE_SECRET_FILE`,
/// `RACKWIRE_NAME`, `RACKWIRE_STATE_DIR`, `RACKWIRE_METRICS`, ...), then the command line.
///
/// ```toml
/// mh = "127.0.0.1:7700"
/// secret_file = "/etc/rackwire/secret"   # or: secret = "..."
/// name = "node-a"
/// copy_channels = 2
/// state_dir = "/var/lib/rackwire"   # this node's key pair, kept across restarts
/// peer_timeout_ms = 10000           # edge transport: silence on every link before a peer is gone
/// metrics = "127.0.0.1:9470"        # serve Prometheus metrics at /metrics
/// ```
#[derive(Clone)]
pub struct FabricConfig {
    /// Management host address, `host:port`.
    pub mh: String,
    /// The fabric's shared secret.
    pub secret: Vec<u8>,
    /// This node's name (unique in the fabric).
    pub name: String,
    /// The node has no name of its own (neither the file nor `RACKWIRE_NAME` gives one, as
    /// for a job's processes): it joins as `node-PID-KEY`, with a key pair made for this run
    /// and kept in memory only, and the management host forgets it a minute after it leaves.
    /// A named node keeps its key pair in the state folder, and so its id and its grants.
    pub transient: bool,
    /// Where this node's shared-memory endpoint lives (default: a per-user runtime folder).
    pub runtime_dir: Option<PathBuf>,
    /// Copy channels for large batches (1 = the calling thread only).
    pub copy_channels: usize,
    /// How long an operation may wait for ring room or for its peer.
    pub op_timeout: Duration,
    /// Transport selection.
    pub transport: TransportChoice,
    /// Edge transport: how long every link to a peer may stay silent before the peer is taken
    /// as gone (see [`PEER_TIMEOUT_DEFAULT`]; `peer_timeout_ms`, `RACKWIRE_PEER_TIMEOUT_MS`).
    pub peer_timeout: Duration,
    /// How long a waiting receiver polls before it sleeps on its doorbell (latency against
    /// CPU: polling answers in well under a microsecond, waking from sleep takes tens); over
    /// the edge transport a waiting thread drives the sockets itself this long
    /// (`RACKWIRE_BUSY_POLL_US`).
    pub busy_poll: Duration,
    /// How long the edge transport's network thread keeps looking for frames after its last
    /// work before it sleeps in the kernel; `None`: learned from how soon answers to what it
    /// sent came lately (50–200 µs). `Some(0)` spends no core time waiting, at the cost of a
    /// wake-up per frame (`net_spin_us`, `RACKWIRE_NET_SPIN_US`).
    pub net_spin: Option<Duration>,
    /// Local addresses of this node's Ethernet links for the edge transport, one per rail
    /// (`ip:port`, port 0 picks one). Empty: no edge transport.
    pub links: Vec<String>,
    /// Largest frame on the links (the link MTU less IP and UDP headers).
    pub link_mtu: usize,
    /// Faults to inject on the links' send paths (testing).
    pub faults: Option<rackwire_udp::FaultSpec>,
    /// Memory domain: nodes on one machine share memory only when their domains are equal
    /// too (a virtual rack gives a second rack, or a remote host, a domain of its own, so it is
    /// reached over Ethernet only). Empty: the machine is one domain.
    pub memory_domain: String,
    /// Where this node keeps what must outlive it: its key pair (`keys/NAME.key`), made on
    /// first join and reused on every restart, so the node keeps its id and its grants.
    /// Default: `RACKWIRE_STATE_DIR`, else `$XDG_STATE_HOME/rackwire`, else
    /// `~/.local/state/rackwire`.
    pub state_dir: Option<PathBuf>,
    /// Seal edge frames (encrypted and authenticated under keys from the handshake; see
    /// `rackwire_proto`). Frames go unsealed only when both ends turn this off, which is for
    /// measuring what sealing costs (`RACKWIRE_SEAL=off`, `seal_frames = false`).
    pub seal_frames: bool,
    /// Deliver each edge connection's frames to this node in the order they were sent, a
    /// frame beyond a gap waiting until it closes (MultiEdge's ordered links; `in_order =
    /// true`, `RACKWIRE_IN_ORDER=on`). Off (the default): frames act as they arrive.
    pub in_order: bool,
    /// Close this process's descriptors, and so the memory of its regions, to other processes
    /// of the same user (the process is made non-dumpable: its `/proc/<pid>/fd` opens to
    /// itself and root only). It then writes no core dump and a debugger of the same user
    /// cannot attach: turn off to debug (`private_memory = false`,
    /// `RACKWIRE_PRIVATE_MEMORY=off`).
    pub private_memory: bool,
    /// Serve this node's counters in the Prometheus text format at `http://ADDR/metrics`
    /// (`metrics = "127.0.0.1:9470"`, `RACKWIRE_METRICS`). None: not served.
    pub metrics: Option<String>,
    /// The management hosts' public keys (hex), the only ones this node takes
    /// (`mh_keys = ["..."]`, `RACKWIRE_MH_KEYS`, comma-separated; `rackwire mh` prints its
    /// key). Empty: each host's key is pinned at first use, per address, in the state folder
    /// (file `mh-hosts`), and a host at a pinned address with another key is refused.
    pub mh_keys: Vec<String>,
}

/// The shortest peer timeout accepted (a few probe intervals).
pub const PEER_TIMEOUT_MIN: Duration = Duration::from_millis(100);
/// The longest peer timeout accepted.
pub const PEER_TIMEOUT_MAX: Duration = Duration::from_secs(3600);

/// Default frame size on edge links: a 1500-byte Ethernet MTU less IPv4 and UDP headers.
pub const LINK_MTU_DEFAULT: usize = 1472;
/// Smallest frame on edge links (a link whose interface takes less is refused).
pub const LINK_MTU_MIN: usize = 256;

impl std::fmt::Debug for FabricConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricConfig")
            .field("mh", &self.mh)
            .field("name", &self.name)
            .field("transient", &self.transient)
            .field("runtime_dir", &self.runtime_dir)
            .field("copy_channels", &self.copy_channels)
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

/// The file as read: every key optional (see [`crate::config_keys::CONFIG_KEYS`]).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileConfig {
    mh: Option<String>,
    secret: Option<String>,
    secret_file: Option<PathBuf>,
    name: Option<String>,
    runtime_dir: Option<PathBuf>,
    copy_channels: Option<usize>,
    op_timeout_ms: Option<u64>,
    transport: Option<TransportChoice>,
    peer_timeout_ms: Option<u64>,
    busy_poll_us: Option<u64>,
    net_spin_us: Option<u64>,
    links: Option<Vec<String>>,
    link_mtu: Option<usize>,
    faults: Option<String>,
    state_dir: Option<PathBuf>,
    seal_frames: Option<bool>,
    in_order: Option<bool>,
    private_memory: Option<bool>,
    metrics: Option<String>,
    mh_keys: Option<Vec<String>>,
    memory_domain: Option<String>,
    pub(crate) management_host: Option<ManagementHostFile>,
}

/// The `[management_host]` table: what `rackwire mh` on this host runs with when its flags do
/// not say (the secret is the file's own `secret` or `secret_file`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagementHostFile {
    /// Address to listen on.
    pub listen: Option<String>,
    /// Folder of the persistent state and the host's key pair.
    pub state: Option<PathBuf>,
    /// etcd endpoints, comma-separated, to keep the state in (hosts on one etcd elect a leader).
    pub etcd: Option<String>,
    /// With `etcd`: the fabric's name (its keys live under `/rackwire/NAME`).
    pub fabric: Option<String>,
    /// Address to serve the host's counters at (`/metrics`).
    pub metrics: Option<String>,
    /// Seconds a node may be down before it is forgotten.
    pub forget_after_s: Option<u64>,
    /// Seconds a transient node may be down before it is forgotten.
    pub forget_transient_after_s: Option<u64>,
}

impl ManagementHostFile {
    /// The `[management_host]` table of the file at `path` (empty when it has none); the rest
    /// of the file is read and checked as every command reads it.
    pub fn read(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let f: FileConfig = toml::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Ok(f.management_host.unwrap_or_default())
    }
}

/// Where a host's configuration file lives when `RACKWIRE_CONFIG` does not say.
pub const CONFIG_PATH_DEFAULT: &str = "/etc/rackwire/rackwire.toml";

/// The configuration file this process reads: `RACKWIRE_CONFIG` when set (set empty: none),
/// else [`CONFIG_PATH_DEFAULT`] when it exists, else none.
pub fn config_path() -> Option<PathBuf> {
    match std::env::var_os(crate::vars::CONFIG) {
        Some(p) if p.is_empty() => None,
        Some(p) => Some(PathBuf::from(p)),
        None => Path::new(CONFIG_PATH_DEFAULT).exists().then(|| PathBuf::from(CONFIG_PATH_DEFAULT)),
    }
}

/// A switch given in the environment: on or off.
fn on_off(var: &str, v: &str) -> Result<bool, Error> {
    match v {
        "on" | "1" | "true" => Ok(true),
        "off" | "0" | "false" => Ok(false),
        other => Err(Error::Config(format!("{var}={other:?}: use on or off"))),
    }
}

fn default_name() -> String {
    format!("node-{}", std::process::id())
}

/// The fabric secret in the file `p`: its bytes less a trailing line end. A file that anyone
/// but its owner may read or write, that another user owns, or that is a link, is refused
/// (as ssh refuses such a key): `chmod 600` it.
pub fn read_secret_file(p: &Path) -> Result<Vec<u8>, Error> {
    rackwire_mh::owner_only::check_file(p).map_err(|e| Error::Config(format!("secret file {e}")))?;
    let s = std::fs::read_to_string(p).map_err(|e| Error::Config(format!("secret file {}: {e}", p.display())))?;
    Ok(s.trim_end_matches(['\n', '\r']).as_bytes().to_vec())
}

impl FabricConfig {
    /// A configuration from its three essentials.
    pub fn new(mh: impl Into<String>, secret: impl AsRef<[u8]>, name: impl Into<String>) -> Self {
        FabricConfig {
            mh: mh.into(),
            secret: secret.as_ref().to_vec(),
            name: name.into(),
            transient: false,
            runtime_dir: None,
            copy_channels: 2,
            op_timeout: OP_TIMEOUT_DEFAULT,
            transport: TransportChoice::Auto,
            peer_timeout: PEER_TIMEOUT_DEFAULT,
            busy_poll: BUSY_POLL_DEFAULT,
            net_spin: None,
            links: Vec::new(),
            memory_domain: String::new(),
            link_mtu: LINK_MTU_DEFAULT,
            faults: None,
            state_dir: None,
            seal_frames: true,
            in_order: false,
            private_memory: true,
            metrics: None,
            mh_keys: Vec::new(),
        }
    }

    /// Check the TOML file at `path` as [`FabricConfig::from_file`] reads it, and say every
    /// problem found, one line each (`PATH:LINE: what is wrong`): a file that does not parse, each
    /// unknown key, each value of the wrong type, no management host, no secret; then, if the
    /// keys are right, what loading and validating it refuses (a secret file others may read, a
    /// name or a timeout out of range).
    pub fn check_file(path: &Path) -> Result<(), Vec<String>> {
        let shown = path.display();
        let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{shown}: {e}")])?;
        let table: toml::Table = toml::from_str(&text).map_err(|e| {
            let at = e.span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            let what = e.message().to_string();
            vec![at.map_or_else(|| format!("{shown}: {what}"), |l| format!("{shown}:{l}: {what}"))]
        })?;
        // The line a key is set on (the first `key =` there), or a table's header (`[key]`).
        let line_of = |key: &str| {
            text.lines()
                .position(|l| {
                    let l = l.trim_start();
                    l.strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('='))
                        || l.strip_prefix('[').and_then(|r| r.strip_prefix(key)).is_some_and(|r| r.starts_with(']'))
                })
                .map(|i| i + 1)
        };
        let mut by_line = Vec::new();
        for (key, value) in &table {
            // Each key alone, as the whole file is read: the reader's own words for what is wrong.
            let one = toml::Table::from_iter([(key.clone(), value.clone())]);
            if let Err(e) = one.try_into::<FileConfig>() {
                by_line.push((line_of(key), format!("{key}: {}", e.message().trim())));
            }
        }
        by_line.sort_by_key(|(l, _)| l.unwrap_or(usize::MAX));
        let mut problems: Vec<String> = by_line
            .into_iter()
            .map(|(l, what)| l.map_or_else(|| format!("{shown}: {what}"), |l| format!("{shown}:{l}: {what}")))
            .collect();
        if !table.contains_key("mh") {
            problems.push(format!("{shown}: no management host (mh = \"host:port\", or RACKWIRE_MH)"));
        }
        if !table.contains_key("secret") && !table.contains_key("secret_file") {
            problems.push(format!("{shown}: no secret (secret_file = \"/etc/rackwire/secret\", mode 600)"));
        }
        if problems.is_empty() {
            if let Err(e) = FabricConfig::from_file(path).and_then(|c| c.validate()) {
                problems.push(format!("{shown}: {e}"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    /// Read a TOML file (see the type's documentation for the keys).
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        Self::read_file(path, true)
    }

    /// [`FabricConfig::from_file`]; its secret read only when `secret` (the environment may
    /// give another: a service handed a copy of a secret file it could not read itself).
    fn read_file(path: &Path, secret: bool) -> Result<Self, Error> {
        // Whoever can change the file chooses the management host and the links: only its
        // owner (this user or root) may.
        rackwire_mh::owner_only::check_readable_file(path)
            .map_err(|e| Error::Config(format!("configuration file {e}")))?;
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let f: FileConfig = toml::from_str(&text).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let transient = f.name.is_none();
        let mut c = FabricConfig::new(
            f.mh.unwrap_or_default(),
            f.secret.unwrap_or_default(),
            f.name.unwrap_or_else(default_name),
        );
        c.transient = transient;
        if let Some(p) = f.secret_file.filter(|_| secret) {
            c.secret = read_secret_file(&p)?;
        }
        c.runtime_dir = f.runtime_dir;
        c.state_dir = f.state_dir;
        c.metrics = f.metrics;
        c.mh_keys = f.mh_keys.unwrap_or_default();
        c.memory_domain = f.memory_domain.unwrap_or_default();
        if let Some(b) = f.seal_frames {
            c.seal_frames = b;
        }
        if let Some(b) = f.in_order {
            c.in_order = b;
        }
        if let Some(b) = f.private_memory {
            c.private_memory = b;
        }
        if let Some(n) = f.copy_channels {
            c.copy_channels = n;
        }
        if let Some(ms) = f.op_timeout_ms {
            c.op_timeout = Duration::from_millis(ms);
        }
        if let Some(t) = f.transport {
            c.transport = t;
        }
        if let Some(ms) = f.peer_timeout_ms {
            c.peer_timeout = Duration::from_millis(ms);
        }
        if let Some(us) = f.busy_poll_us {
            c.busy_poll = Duration::from_micros(us);
        }
        if let Some(us) = f.net_spin_us {
            c.net_spin = Some(Duration::from_micros(us));
        }
        if let Some(l) = f.links {
            c.links = l;
        }
        if let Some(m) = f.link_mtu {
            c.link_mtu = m;
        }
        if let Some(spec) = f.faults {
            c.faults = Some(spec.parse().map_err(|e| Error::Config(format!("{}: faults: {e}", path.display())))?);
        }
        Ok(c)
    }

    /// The configuration file ([`config_path`]: `RACKWIRE_CONFIG`, else the host's
    /// [`CONFIG_PATH_DEFAULT`] if there is one), then the `RACKWIRE_*` variables over it.
    pub fn from_env() -> Result<Self, Error> {
        // A secret in the environment stands for the file's, which is then not read.
        let env_secret =
            std::env::var_os(crate::vars::SECRET).is_some() || std::env::var_os(crate::vars::SECRET_FILE).is_some();
        let mut c = match config_path() {
            Some(p) => FabricConfig::read_file(&p, !env_secret)?,
            None => FabricConfig { transient: true, ..FabricConfig::new("", "", default_name()) },
        };
        if let Ok(v) = std::env::var(crate::vars::MH) {
            c.mh = v;
        }
        if let Ok(v) = std::env::var(crate::vars::SECRET) {
            c.secret = v.into_bytes();
        }
        if let Some(p) = std::env::var_os(crate::vars::SECRET_FILE) {
            c.secret = read_secret_file(Path::new(&p))?;
        }
        if let Ok(v) = std::env::var(crate::vars::NAME) {
            c.name = v;
            c.transient = false;
        }
        if let Ok(v) = std::env::var(crate::vars::LINK_MTU) {
            c.link_mtu = v.parse().map_err(|_| Error::Config(format!("{}={v:?}: bytes", crate::vars::LINK_MTU)))?;
        }
        if let Ok(v) = std::env::var(crate::vars::BUSY_POLL_US) {
            let us: u64 =
                v.parse().map_err(|_| Error::Config(format!("{}={v:?}: microseconds", crate::vars::BUSY_POLL_US)))?;
            c.busy_poll = Duration::from_micros(us);
        }
        if let Ok(v) = std::env::var(crate::vars::NET_SPIN_US) {
            let us: u64 =
                v.parse().map_err(|_| Error::Config(format!("{}={v:?}: microseconds", crate::vars::NET_SPIN_US)))?;
            c.net_spin = Some(Duration::from_micros(us));
        }
        if let Ok(v) = std::env::var(crate::vars::MEMORY_DOMAIN) {
            c.memory_domain = v;
        }
        if let Ok(v) = std::env::var(crate::vars::LINKS) {
            c.links = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        }
        if let Ok(v) = std::env::var(crate::vars::TRANSPORT) {
            c.transport = match v.as_str() {
                "auto" => TransportChoice::Auto,
                "shm" => TransportChoice::Shm,
                "edge" => TransportChoice::Edge,
                other => {
                    return Err(Error::Config(format!("{}={other:?}: use auto, shm or edge", crate::vars::TRANSPORT)))
                }
            };
        }
        if let Ok(v) = std::env::var(crate::vars::OP_TIMEOUT_MS) {
            let ms: u64 =
                v.parse().map_err(|_| Error::Config(format!("{}={v:?}: milliseconds", crate::vars::OP_TIMEOUT_MS)))?;
            c.op_timeout = Duration::from_millis(ms);
        }
        if let Ok(v) = std::env::var(crate::vars::COPY_CHANNELS) {
            c.copy_channels =
                v.parse().map_err(|_| Error::Config(format!("{}={v:?}: a count", crate::vars::COPY_CHANNELS)))?;
        }
        if let Some(p) = std::env::var_os(crate::vars::RUNTIME_DIR) {
            c.runtime_dir = Some(PathBuf::from(p));
        }
        if let Ok(v) = std::env::var(crate::vars::PEER_TIMEOUT_MS) {
            let ms: u64 = v
                .parse()
                .map_err(|_| Error::Config(format!("{}={v:?}: milliseconds", crate::vars::PEER_TIMEOUT_MS)))?;
            c.peer_timeout = Duration::from_millis(ms);
        }
        if let Some(p) = std::env::var_os(crate::vars::STATE_DIR) {
            c.state_dir = Some(PathBuf::from(p));
        }
        if let Ok(v) = std::env::var(crate::vars::MH_KEYS) {
            c.mh_keys = v.split(',').map(str::trim).filter(|k| !k.is_empty()).map(String::from).collect();
        }
        if let Ok(v) = std::env::var(crate::vars::METRICS) {
            c.metrics = (!v.is_empty()).then_some(v);
        }
        if let Ok(v) = std::env::var(crate::vars::SEAL) {
            c.seal_frames = on_off(crate::vars::SEAL, &v)?;
        }
        if let Ok(v) = std::env::var(crate::vars::IN_ORDER) {
            c.in_order = on_off(crate::vars::IN_ORDER, &v)?;
        }
        if let Ok(v) = std::env::var(crate::vars::PRIVATE_MEMORY) {
            c.private_memory = on_off(crate::vars::PRIVATE_MEMORY, &v)?;
        }
        if let Ok(v) = std::env::var(crate::vars::FAULTS) {
            c.faults = Some(v.parse().map_err(|e| Error::Config(format!("{}: {e}", crate::vars::FAULTS)))?);
        }
        Ok(c)
    }

    /// Check the configuration and say plainly what is missing.
    pub fn validate(&self) -> Result<(), Error> {
        if self.mh.is_empty() {
            return Err(Error::Config(
                "no management host address (set RACKWIRE_MH, `mh` in the config file, or --mh)".into(),
            ));
        }
        if self.secret.len() < rackwire_mh::auth::SECRET_BYTES_MIN {
            return Err(Error::Config(format!(
                "the fabric secret must be at least {} bytes (set RACKWIRE_SECRET, RACKWIRE_SECRET_FILE or `secret_file`)",
                rackwire_mh::auth::SECRET_BYTES_MIN
            )));
        }
        rackwire_mh::check_name(&self.name)?;
        if self.links.len() > rackwire_proto::LINKS_MAX {
            return Err(Error::Config(format!("at most {} links", rackwire_proto::LINKS_MAX)));
        }
        if self.transport == TransportChoice::Edge && self.links.is_empty() {
            return Err(Error::Config(
                "transport edge needs at least one link (RACKWIRE_LINKS, `links`, or --link)".into(),
            ));
        }
        if !(LINK_MTU_MIN..=rackwire_udp::UDP_PAYLOAD_MAX).contains(&self.link_mtu) {
            return Err(Error::Config(format!("link_mtu must be {LINK_MTU_MIN}..={}", rackwire_udp::UDP_PAYLOAD_MAX)));
        }
        if !(PEER_TIMEOUT_MIN..=PEER_TIMEOUT_MAX).contains(&self.peer_timeout) {
            return Err(Error::Config(format!(
                "peer_timeout must be {} ms..={} s",
                PEER_TIMEOUT_MIN.as_millis(),
                PEER_TIMEOUT_MAX.as_secs()
            )));
        }
        if !(1..=rackwire_shm::COPY_CHANNELS_MAX).contains(&self.copy_channels) {
            return Err(Error::Config(format!("copy_channels must be 1..={}", rackwire_shm::COPY_CHANNELS_MAX)));
        }
        Ok(())
    }

    /// The file holding this node's key pair (see [`FabricConfig::state_dir`]).
    pub fn key_path(&self) -> PathBuf {
        self.state_path().join("keys").join(format!("{}.key", self.name))
    }

    /// Which management hosts this node takes (see [`FabricConfig::mh_keys`]).
    pub fn mh_trust(&self) -> Result<rackwire_mh::MhTrust, Error> {
        if self.mh_keys.is_empty() {
            return Ok(rackwire_mh::MhTrust::FirstUse(self.state_path().join("mh-hosts")));
        }
        let keys = self.mh_keys.iter().map(|k| {
            rackwire_mh::identity::public_from_hex(k)
                .ok_or_else(|| Error::Config(format!("mh_keys: {k:?} is not a public key (64 hex digits)")))
        });
        Ok(rackwire_mh::MhTrust::Keys(keys.collect::<Result<_, _>>()?))
    }

    /// This node's state folder (see [`FabricConfig::state_dir`]).
    fn state_path(&self) -> PathBuf {
        self.state_dir
            .clone()
            .or_else(|| std::env::var_os(crate::vars::STATE_DIR).map(PathBuf::from))
            .or_else(|| std::env::var_os("XDG_STATE_HOME").map(|d| PathBuf::from(d).join("rackwire")))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/rackwire")))
            .unwrap_or_else(|| self.runtime_dir().join("state"))
    }

    /// The folder for this node's endpoint socket.
    pub(crate) fn runtime_dir(&self) -> PathBuf {
        if let Some(d) = &self.runtime_dir {
            return d.clone();
        }
        if let Some(d) = std::env::var_os(crate::vars::RUNTIME_DIR) {
            return PathBuf::from(d);
        }
        let uid = current_uid();
        std::env::temp_dir().join(format!("rackwire-{uid}"))
    }
}

fn current_uid() -> u32 {
    // The runtime folder is per user; the uid is read from /proc to keep this crate free of
    // system-call code.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|u| u.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    // Checks the file format: known keys are read (the key pair's place follows state_dir and
    // the name; a file with no name makes a transient node; a peer timeout out of range is
    // refused), a secret file's trailing newline is dropped, a secret file others may read
    // (0644) is refused, the file itself refused once others may change it (0666), and an
    // unknown key is an error naming the file.
    #[test]
    fn reads_toml_and_refuses_unknown_keys() {
        let dir = std::env::temp_dir().join(format!("rw-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("secret"), "s3cret-value-0123456789\n").unwrap();
        let chmod = |mode| std::fs::set_permissions(dir.join("secret"), PermissionsExt::from_mode(mode)).unwrap();
        chmod(0o644);
        let open = FabricConfig::from_file(&{
            let p = dir.join("open.toml");
            std::fs::write(&p, format!("mh = \"h:1\"\nsecret_file = {:?}\n", dir.join("secret"))).unwrap();
            p
        });
        assert!(
            matches!(open, Err(Error::Config(m)) if m.contains("chmod 600")),
            "a secret file others may read is refused"
        );
        chmod(0o600);
        let good = dir.join("good.toml");
        std::fs::write(
            &good,
            format!(
                "mh = \"127.0.0.1:1\"\nname = \"n1\"\nsecret_file = {:?}\ncopy_channels = 3\nstate_dir = \"/s\"\n\
                 seal_frames = false\nprivate_memory = false\npeer_timeout_ms = 2500\nmetrics = \"127.0.0.1:9\"\n",
                dir.join("secret")
            ),
        )
        .unwrap();
        let c = FabricConfig::from_file(&good).unwrap();
        assert_eq!(c.secret, b"s3cret-value-0123456789");
        assert_eq!(c.copy_channels, 3);
        assert_eq!(c.name, "n1");
        assert!(!c.transient, "a named node keeps its key pair");
        let unnamed = dir.join("unnamed.toml");
        std::fs::write(&unnamed, "mh = \"127.0.0.1:1\"\nsecret = \"s3cret-value-0123456789\"\n").unwrap();
        let u = FabricConfig::from_file(&unnamed).unwrap();
        assert!(u.transient && u.name == default_name(), "no name: transient, named after the process");
        assert_eq!(c.key_path(), PathBuf::from("/s/keys/n1.key"));
        assert!(!c.seal_frames);
        assert!(!c.private_memory);
        assert_eq!(c.peer_timeout, Duration::from_millis(2500));
        assert_eq!(c.metrics.as_deref(), Some("127.0.0.1:9"));
        c.validate().unwrap();
        let mut short = c.clone();
        short.peer_timeout = Duration::from_millis(1);
        assert!(short.validate().unwrap_err().to_string().contains("peer_timeout"));
        // A configuration file others may change is refused, naming the fix.
        std::fs::set_permissions(&good, PermissionsExt::from_mode(0o666)).unwrap();
        assert!(
            matches!(FabricConfig::from_file(&good), Err(Error::Config(m)) if m.contains("chmod go-w")),
            "a configuration file others may change is refused"
        );
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "mh = \"x\"\nsecrett = \"typo\"\n").unwrap();
        assert!(matches!(FabricConfig::from_file(&bad), Err(Error::Config(m)) if m.contains("bad.toml")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    // Checks that validation names what is missing.
    #[test]
    fn validation_says_what_is_missing() {
        let e = FabricConfig::new("", "long-enough", "n").validate().unwrap_err();
        assert!(e.to_string().contains("management host"));
        let e = FabricConfig::new("h:1", "short", "n").validate().unwrap_err();
        assert!(e.to_string().contains("secret"));
    }
}
