//! The rackwire management host (MH) and the client nodes use to talk to it.
//!
//! The management host is the control plane of a rack: it admits nodes that prove they hold
//! the fabric's shared secret (a SPAKE2 exchange over it, confirmed both ways: the secret never
//! crosses the wire) and, for a node, its own key; gives each a stable id by name, keeps the
//! name table (node name → how to reach it), the region directory (name → remote region
//! handle) and the record of grants, and knows which nodes are up (heartbeats). Its state survives a restart. Nodes cache what they resolved, so
//! traffic between peers that already know each other goes on while it is down.
//!
//! The wire protocol is newline-delimited JSON over TCP: the control plane is not on the data
//! path, and a readable protocol is easy to inspect.

#![deny(unsafe_code)]

// What both ends use: the protocol, its line, admission's cryptography, jobs' tokens.
pub mod auth;
mod channel;
pub use rackwire_wire::identity;
pub use rackwire_wire::owner_only;
mod client;
pub mod jobs;
mod line;
pub mod proto;

// The management host itself (feature `server`, on by default): a node's library takes the
// client only.
#[cfg(feature = "server")]
mod admission;
#[cfg(feature = "server")]
mod departed;
#[cfg(feature = "server")]
pub mod etcd;
#[cfg(feature = "server")]
mod forgetting;
#[cfg(feature = "server")]
mod job_table;
#[cfg(feature = "server")]
mod lead;
#[cfg(feature = "server")]
mod metrics;
#[cfg(feature = "server")]
mod requests;
#[cfg(feature = "server")]
mod server;
#[cfg(feature = "server")]
pub mod sessions;
#[cfg(feature = "server")]
mod shared;
#[cfg(feature = "server")]
mod state;

pub use client::{MhClient, MhConfig, MhTrust, Role};
pub use proto::{GrantEntry, JobMember, JobRound, NodeId, NodeInfo, NodeStatus, RegionEntry};
#[cfg(feature = "server")]
pub use server::{ManagementHost, MhHandle};

use std::time::Duration;

/// How long a node may stay down before it is forgotten, unless set otherwise
/// (`rackwire mh --forget-after`).
pub const FORGET_AFTER_DEFAULT: Duration = Duration::from_secs(7 * 24 * 3600);
/// When the node table is full, a node down at least this long (or the forget-after time, if
/// shorter) makes room for a new one.
pub const EVICT_AFTER_MIN: Duration = Duration::from_secs(600);
/// How long a transient node may stay down before it is forgotten, unless set otherwise
/// (`rackwire mh --forget-transient-after`): long enough to come back with its id after a
/// management host's restart or a network blip, short enough that a rack running jobs all day
/// does not fill the node table with processes that are gone.
pub const TRANSIENT_FORGET_AFTER_DEFAULT: Duration = Duration::from_secs(60);
/// How often a node tells the management host it is alive.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// Heartbeats a node may miss before it is marked down.
pub const HEARTBEATS_MISSED_MAX: u32 = 4;
/// The longest line of the control protocol, in bytes.
pub const MH_LINE_BYTES_MAX: usize = 1 << 20;
/// A reply that lists (nodes, regions and grants, a job round's members) holds at most this
/// many bytes of entries, and says where the next page starts: every reply fits a line
/// ([`MH_LINE_BYTES_MAX`]), whatever the state holds.
pub const REPLY_PAGE_BYTES: usize = 256 * 1024;
/// Pages a client reads for one list, at most (the state's limits make fewer enough).
pub const REPLY_PAGES_MAX: usize = 4096;
const _: () = assert!(REPLY_PAGE_BYTES * 2 < MH_LINE_BYTES_MAX);
/// The most nodes one management host admits.
pub const NODES_MAX: usize = 4096;
/// The most published region names.
pub const REGION_NAMES_MAX: usize = 65536;
/// The most recorded grants.
pub const GRANTS_MAX: usize = 1 << 20;
/// Region names one node may publish, at most (so that no node fills the directory).
pub const NAMES_PER_NODE_MAX: usize = 4096;
/// Grants one node may record, at most (a 256-rank job's window granted to every other rank
/// is 255; so that no node fills the table).
pub const GRANTS_PER_NODE_MAX: usize = 1 << 16;
/// The longest node or region name, in bytes.
pub const NAME_BYTES_MAX: usize = 128;
/// How long a request to the management host may take before it is given up.
pub const MH_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors talking to the management host.
#[derive(Debug, thiserror::Error)]
pub enum MhError {
    /// The management host cannot be reached now (down, restarting, network). Data-plane
    /// traffic between peers that already resolved each other is not affected.
    #[error("management host unavailable: {0}")]
    Unavailable(String),
    /// Admission refused: the shared secret is wrong, the name is taken by a live node, or a
    /// limit is reached. Fix the configuration; retrying will not help.
    #[error("admission refused by the management host: {0}")]
    Denied(String),
    /// The server could not prove it holds the shared secret: it is not our management host.
    #[error("the management host could not prove it holds the fabric secret")]
    ServerNotAuthentic,
    /// The name or id asked for is not known.
    #[error("not found: {0}")]
    NotFound(String),
    /// A request was refused as malformed or not allowed.
    #[error("request refused: {0}")]
    Refused(String),
    /// The other side broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// Bad configuration (empty secret, bad address, bad name).
    #[error("bad configuration: {0}")]
    Config(String),
}

/// Checks a node or region name: 1 to [`NAME_BYTES_MAX`] bytes of letters, digits and `-_./:@`.
pub fn check_name(name: &str) -> Result<(), MhError> {
    let ok = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:@".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(MhError::Config(format!("name {name:?} must be 1..={NAME_BYTES_MAX} bytes of letters, digits and -_./:@")))
    }
}
