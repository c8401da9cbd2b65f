//! The environment variables rackwire's programs read, each named once: the library's
//! configuration (over the host's file, see [`crate::FabricConfig::from_env`]), a job's
//! placement (set by `rackwire launch`), and the tools' own. Code that sets or reads one uses
//! these names, never a copy of the text (a test holds the workspace to that).

/// Management host address(es), `host:port`, comma-separated for standbys.
pub const MH: &str = "RACKWIRE_MH";
/// The management hosts' public keys, comma-separated (64 hex digits each).
pub const MH_KEYS: &str = "RACKWIRE_MH_KEYS";
/// The fabric's shared secret itself.
pub const SECRET: &str = "RACKWIRE_SECRET";
/// A file holding the fabric's shared secret (owner-only).
pub const SECRET_FILE: &str = "RACKWIRE_SECRET_FILE";
/// This node's name (a node without one joins as a transient node).
pub const NAME: &str = "RACKWIRE_NAME";
/// The configuration file (default `/etc/rackwire/rackwire.toml`).
pub const CONFIG: &str = "RACKWIRE_CONFIG";
/// Where a node keeps its key pair and pinned host keys.
pub const STATE_DIR: &str = "RACKWIRE_STATE_DIR";
/// Where a node's shared-memory endpoint socket lives.
pub const RUNTIME_DIR: &str = "RACKWIRE_RUNTIME_DIR";
/// `auto`, `shm` or `edge`: which transport reaches which peer.
pub const TRANSPORT: &str = "RACKWIRE_TRANSPORT";
/// The node's edge links, one address per rail, comma-separated.
pub const LINKS: &str = "RACKWIRE_LINKS";
/// The largest frame on the links (the links' MTU less 28 bytes).
pub const LINK_MTU: &str = "RACKWIRE_LINK_MTU";
/// How long every link to a peer may stay silent before the peer is gone (ms).
pub const PEER_TIMEOUT_MS: &str = "RACKWIRE_PEER_TIMEOUT_MS";
/// How long an operation may wait for room or an answer (ms).
pub const OP_TIMEOUT_MS: &str = "RACKWIRE_OP_TIMEOUT_MS";
/// How long a waiting receiver polls before it sleeps (µs).
pub const BUSY_POLL_US: &str = "RACKWIRE_BUSY_POLL_US";
/// How long the edge transport's network thread looks for frames after work before it sleeps
/// (µs; unset: learned from how soon answers come).
pub const NET_SPIN_US: &str = "RACKWIRE_NET_SPIN_US";
/// Threads that copy a large batch of shared-memory operations.
pub const COPY_CHANNELS: &str = "RACKWIRE_COPY_CHANNELS";
/// Nodes on one machine share memory only when their memory domains are equal.
pub const MEMORY_DOMAIN: &str = "RACKWIRE_MEMORY_DOMAIN";
/// `on`/`off`: seal edge frames.
pub const SEAL: &str = "RACKWIRE_SEAL";
/// `on`/`off`: edge frames delivered to this node in the order they were sent.
pub const IN_ORDER: &str = "RACKWIRE_IN_ORDER";
/// `on`/`off`: close the process to others of the same user (no dumps, no debugger).
pub const PRIVATE_MEMORY: &str = "RACKWIRE_PRIVATE_MEMORY";
/// Serve this node's counters for Prometheus at this address.
pub const METRICS: &str = "RACKWIRE_METRICS";
/// Faults injected on the links' send paths, for tests (`drop=0.01,dup=0.001,seed=7`).
pub const FAULTS: &str = "RACKWIRE_FAULTS";
/// `off`: the edge links receive without UDP receive offload.
pub use rackwire_udp::GRO_VAR as GRO;
/// `off`: the edge links send without UDP segmentation offload.
pub use rackwire_udp::GSO_VAR as GSO;

/// A job's rank of this process (set by `rackwire launch`).
pub const RANK: &str = "RACKWIRE_RANK";
/// A job's number of ranks.
pub const SIZE: &str = "RACKWIRE_SIZE";
/// This process's rank among the job's ranks on its host.
pub const LOCAL_RANK: &str = "RACKWIRE_LOCAL_RANK";
/// The job's name.
pub const JOB: &str = "RACKWIRE_JOB";
/// The job's token: only its ranks hold it.
pub const JOB_TOKEN: &str = "RACKWIRE_JOB_TOKEN";
/// How long a job's group waits for its ranks (ms).
pub const GROUP_TIMEOUT_MS: &str = "RACKWIRE_GROUP_TIMEOUT_MS";

/// A virtual rack's host: its rail devices, in the order of its links.
pub const LINK_DEVS: &str = "RACKWIRE_LINK_DEVS";
/// Where virtual racks keep their state (default `/run/rackwire/racks`).
pub const RACK_DIR: &str = "RACKWIRE_RACK_DIR";

/// Every variable named here.
pub const ALL: &[&str] = &[
    MH,
    MH_KEYS,
    SECRET,
    SECRET_FILE,
    NAME,
    CONFIG,
    STATE_DIR,
    RUNTIME_DIR,
    TRANSPORT,
    LINKS,
    LINK_MTU,
    PEER_TIMEOUT_MS,
    OP_TIMEOUT_MS,
    BUSY_POLL_US,
    NET_SPIN_US,
    COPY_CHANNELS,
    MEMORY_DOMAIN,
    SEAL,
    IN_ORDER,
    PRIVATE_MEMORY,
    METRICS,
    FAULTS,
    GSO,
    GRO,
    RANK,
    SIZE,
    LOCAL_RANK,
    JOB,
    JOB_TOKEN,
    GROUP_TIMEOUT_MS,
    LINK_DEVS,
    RACK_DIR,
];
