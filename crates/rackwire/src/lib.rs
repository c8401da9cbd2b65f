//! rackwire: a rack-area network stack in software.
//!
//! Processes of a small cluster join one **fabric** run by a management host, and then move
//! data between them with:
//!
//! - **one-sided operations** into memory its owner registered and granted: [`Conn::write`],
//!   [`Conn::read`], [`Conn::write_batch`], [`Conn::compare_swap`], [`Conn::fetch_add`],
//!   [`Conn::write_signal`] (data, then a signal word the target watches), each
//!   optionally notifying the target with a 64-bit immediate ([`OpFlags::notify`]) and ordered
//!   by fences ([`OpFlags::fence_before`], [`OpFlags::fence_after`]); unordered by default;
//! - **two-sided messages**: [`Conn::send`] and [`Fabric::recv_timeout`].
//!
//! Every operation returns an [`Op`] handle with `poll`, `wait` and `wait_timeout`. Every
//! failure has its own [`Error`] variant, decided where it must be (access is checked by the
//! target's rules, and refused access never touches the target's memory).
//!
//! ```no_run
//! use rackwire::{Access, Fabric, FabricConfig, OpFlags};
//! # fn main() -> Result<(), rackwire::Error> {
//! let fabric = Fabric::join(FabricConfig::from_env()?)?;
//! let region = fabric.alloc(1 << 20, Access::READ | Access::WRITE)?;
//! region.publish("my-buffer")?;
//! // ... on another node:
//! let target = fabric.lookup("my-buffer")?;
//! let conn = fabric.connect(target.node())?;
//! conn.write(&target, 0, b"hello", OpFlags::default().notify(42)).wait()?;
//! # Ok(()) }
//! ```
//!
//! Peers that share memory with this process are reached through the shared-memory
//! transport; the edge transport over Ethernet plugs in behind the same calls (the
//! crate-private `transport` module holds the seam and what every transport must guarantee).

#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

mod access;
mod config;
mod config_keys;
mod conn;
mod edge;
mod error;
mod fabric;
mod grants;
mod handle;
mod hooks;
mod id;
mod metrics;
mod node;
mod op;
mod owner;
mod pin;
mod receive;
mod region;
mod shm;
mod stats;
mod sync;
mod transport;
pub mod vars;
mod watch;

pub use access::{Access, ParseAccessError};
pub use bytes::Bytes;
pub use config::{
    config_path, read_secret_file, FabricConfig, ManagementHostFile, TransportChoice, BUSY_POLL_DEFAULT,
    CONFIG_PATH_DEFAULT, LINK_MTU_DEFAULT, LINK_MTU_MIN, PEER_TIMEOUT_MAX, PEER_TIMEOUT_MIN,
};
pub use config_keys::{reference_markdown as config_reference, Also, ConfigKey, CONFIG_KEYS};
pub use conn::Conn;
pub use error::{Error, ErrorKind, Limit, MhErrorText};
pub use fabric::Fabric;
pub use handle::{RemoteRegion, REMOTE_REGION_BYTES};
pub use hooks::EdgeHooks;
pub use id::RegionId;
pub use op::{BatchOptions, Cmp, Completion, Notification, Op, OpFlags, Signal, SignalOp};
pub use pin::{Pinned, PINS_PER_MAPPING_MAX};
pub use rackwire_mh::jobs::token_tag as job_token_tag;
pub use rackwire_mh::{JobMember, JobRound, NodeId, NodeInfo, NodeStatus};
#[cfg(feature = "mh-server")]
pub use rackwire_mh::{ManagementHost, MhHandle};
pub use rackwire_shm::{copy_bytes, COPY_CHANNELS_MAX};
pub use receive::{Message, Receiver};
pub use region::{Region, RevokeOutcome, WORD_WAIT_NAP};
pub use stats::{ConnStats, EdgeStats, ShmStats};
pub use watch::{EdgeMessageHandler, EdgeWatch};

use std::time::Duration;

/// The largest two-sided message, in bytes (the edge protocol's limit, which shared memory
/// keeps too: a message goes over either transport alike).
pub use rackwire_proto::MESSAGE_BYTES_MAX;
/// Bytes of each per-sender message ring in the receiver's memory.
pub const MESSAGE_RING_BYTES: u64 = 1 << 20;
/// Bytes of each per-sender notification (completion) ring in the receiver's memory.
pub const NOTIFY_RING_BYTES: u64 = 256 * 1024;
/// The most regions one node may have at once.
pub const REGIONS_MAX: usize = 4096;
/// The most peers one node may be connected to at once.
pub const PEERS_MAX: usize = 256;
/// The most entries in one scatter-gather batch.
pub const BATCH_ENTRIES_MAX: usize = 65536;
/// How long connecting to a peer (handshake included) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a peer has to confirm it unmapped a revoked region before it is cut off.
pub const REVOKE_ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// Default bound on how long an operation may wait for room or for its peer: above the peer
/// timeout, so that operations in flight ride out an outage the connection survives.
pub const OP_TIMEOUT_DEFAULT: Duration = Duration::from_secs(15);
/// Default peer timeout of the edge transport: a connection whose every link stayed silent
/// this long is closed and its peer taken as gone (its operations fail with `PeerGone`).
/// Shorter silences, with links dropping and returning in any pattern, only make the peer
/// unreachable for a while: frames move to the links that answer, silent links are probed
/// and used again as soon as one answers, and operations wait.
pub const PEER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

const _: () = assert!(MESSAGE_BYTES_MAX as u64 <= rackwire_shm::ring::payload_bytes_max(MESSAGE_RING_BYTES));
