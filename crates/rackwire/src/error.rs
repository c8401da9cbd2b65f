//! The error type of the public API.

use rackwire_proto::Refusal;

use crate::access::ParseAccessError;
use crate::{Access, NodeId, RegionId};

/// Everything that can go wrong, each case distinct so a caller can act on it.
///
/// Errors about access (`Ungranted`, `Revoked`, `OutOfBounds`, `Misaligned`, `BadKey`,
/// `UnknownRegion`) are decided before any byte of the target is touched: the target's memory
/// is unchanged when one of them is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The owner has not granted this node the access the operation needs. Ask the owner for
    /// a grant.
    #[error("region {region}: access {needed} not granted to this node")]
    Ungranted {
        /// Region.
        region: RegionId,
        /// What the operation needed.
        needed: Access,
    },
    /// The owner revoked this node's grant.
    #[error("region {region}: grant revoked")]
    Revoked {
        /// Region.
        region: RegionId,
    },
    /// The range lies (partly) outside the region.
    #[error("region {region}: range {offset}+{len} outside its {region_len} bytes")]
    OutOfBounds {
        /// Region.
        region: RegionId,
        /// Offset asked for.
        offset: u64,
        /// Length asked for.
        len: u64,
        /// The region's real length.
        region_len: u64,
    },
    /// An atomic needs an 8-byte aligned offset.
    #[error("atomic at offset {offset} is not 8-byte aligned")]
    Misaligned {
        /// Offset asked for.
        offset: u64,
    },
    /// The handle's key does not match the region's: forged or stale handle.
    #[error("region {region}: key does not match (forged or stale handle)")]
    BadKey {
        /// Region.
        region: RegionId,
    },
    /// The owner has no such region (freed, or never existed).
    #[error("region {region} does not exist at node {node}")]
    UnknownRegion {
        /// Owner.
        node: NodeId,
        /// Region.
        region: RegionId,
    },
    /// No such node in the fabric, or the handle names another node than this connection's.
    #[error("unknown peer {0}")]
    UnknownPeer(NodeId),
    /// The peer went away (process ended, connection cut).
    #[error("peer {0} is gone")]
    PeerGone(NodeId),
    /// No transport reaches the peer (for example: another host, and no edge links).
    #[error("peer {node} is not reachable: {why}")]
    Unreachable {
        /// Peer.
        node: NodeId,
        /// Why.
        why: String,
    },
    /// The operation did not complete in time.
    #[error("timed out")]
    Timeout,
    /// A message above [`crate::MESSAGE_BYTES_MAX`].
    #[error("message of {len} bytes exceeds the limit of {max}")]
    MessageTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A limit was reached (which one: [`Limit`]).
    #[error("limit reached: {0}")]
    Limit(Limit),
    /// A remote-region handle could not be parsed.
    #[error("bad region handle: {0}")]
    BadHandle(String),
    /// The peer failed authentication or broke the protocol.
    #[error("peer protocol: {0}")]
    Protocol(String),
    /// Bad configuration or argument.
    #[error("configuration: {0}")]
    Config(String),
    /// The management host refused or could not be reached.
    #[error(transparent)]
    Mh(#[from] MhErrorText),
    /// A system resource failed (memory, descriptors, sockets, threads).
    #[error("system: {op}: {detail}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The kind of the system's error.
        kind: std::io::ErrorKind,
        /// The system's message.
        detail: String,
    },
    /// The fabric was closed.
    #[error("fabric closed")]
    Closed,
    /// The region is moving to fresh memory (its owner cut off a peer that did not give up a
    /// revoked mapping): try again shortly.
    #[error("region {region} is moving to fresh memory; try again")]
    Busy {
        /// Region.
        region: RegionId,
    },
}

/// Which limit an operation or a call reached ([`Error::Limit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum Limit {
    /// The regions one node registers ([`crate::REGIONS_MAX`]).
    #[error("{} regions", crate::REGIONS_MAX)]
    Regions,
    /// The connections one node keeps to its peers ([`crate::PEERS_MAX`]).
    #[error("{} peer connections", crate::PEERS_MAX)]
    Peers,
    /// The pins one mapping of a peer's region holds at once (`max`:
    /// [`crate::PINS_PER_MAPPING_MAX`]).
    #[error("{max} pins of one mapping")]
    Pins {
        /// The most pins of one mapping.
        max: usize,
    },
    /// The entries of one batch: `n` asked, at most [`crate::BATCH_ENTRIES_MAX`].
    #[error("{n} batch entries, at most {}", crate::BATCH_ENTRIES_MAX)]
    BatchEntries {
        /// Entries asked for.
        n: usize,
    },
    /// The edge connections one node keeps ([`rackwire_proto::CONNECTIONS_MAX`]).
    #[error("{} edge connections", rackwire_proto::CONNECTIONS_MAX)]
    EdgeConnections,
    /// The operations queued on one edge connection ([`rackwire_proto::OPS_MAX`]), or an
    /// operation past the largest ([`rackwire_proto::OP_BYTES_MAX`]).
    #[error("edge operations queued or their size")]
    EdgeOperations,
    /// The datagrams queued on one edge connection, for now.
    #[error("the edge datagram queue is full")]
    DatagramQueue,
    /// The peer's message ring has no room for a datagram, for now.
    #[error("no room for the datagram in the peer's ring")]
    PeerRing,
    /// The edge connection has not finished its handshake yet.
    #[error("the edge connection is not established yet")]
    NotEstablished,
}

/// What a caller does about an [`Error`]: its variants grouped by how they are handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The target's rules refused the operation (no grant, a revoked one, a range outside the
    /// region, a misaligned atomic, a stale or forged handle, a region that is gone): nothing
    /// of the target was touched. Fix the request, or ask the owner for a grant.
    Refused,
    /// The peer is gone, unreachable, broke the protocol, or did not answer in time: the
    /// operation's effect is unknown unless it completed. Reconnect, or try elsewhere.
    Lost,
    /// The call itself was wrong: configuration, an unknown node, a handle that does not
    /// parse, a message past the largest. Retrying the same call fails the same way.
    BadUse,
    /// A limit was reached: of this build (regions, peers, pins, batch entries) or of a queue
    /// for now (a full datagram queue, a connection not yet established). Free something, or
    /// try again later.
    Limit,
    /// The management host refused (a wrong secret, a name taken) or cannot be reached.
    ManagementHost,
    /// A system resource failed (memory, descriptors, sockets, threads).
    System,
    /// The region is moving to fresh memory: the same call succeeds shortly.
    TryAgain,
    /// This node's fabric was closed.
    Closed,
}

impl Error {
    /// How a caller handles this error (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Ungranted { .. }
            | Error::Revoked { .. }
            | Error::OutOfBounds { .. }
            | Error::Misaligned { .. }
            | Error::BadKey { .. }
            | Error::UnknownRegion { .. } => ErrorKind::Refused,
            Error::PeerGone(_) | Error::Unreachable { .. } | Error::Timeout | Error::Protocol(_) => ErrorKind::Lost,
            Error::UnknownPeer(_) | Error::MessageTooLarge { .. } | Error::BadHandle(_) | Error::Config(_) => {
                ErrorKind::BadUse
            }
            Error::Limit(_) => ErrorKind::Limit,
            Error::Mh(_) => ErrorKind::ManagementHost,
            Error::Sys { .. } => ErrorKind::System,
            Error::Busy { .. } => ErrorKind::TryAgain,
            Error::Closed => ErrorKind::Closed,
        }
    }
}

/// What the initiator knows of an operation the target refused, to complete the error.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RefusedOp {
    pub node: NodeId,
    pub region: RegionId,
    pub offset: u64,
    pub len: u64,
    pub need: Access,
}

impl Error {
    /// The error for a refusal: the one place where a refusal, from either transport, becomes
    /// an error, keeping its details (the access needed, the region's length).
    pub(crate) fn refused(r: Refusal, op: &RefusedOp) -> Error {
        let region = op.region;
        match r {
            Refusal::Ungranted { needed } => {
                Error::Ungranted { region, needed: if needed == 0 { op.need } else { Access::from_bits(needed) } }
            }
            Refusal::Revoked => Error::Revoked { region },
            Refusal::BadKey => Error::BadKey { region },
            Refusal::UnknownRegion => Error::UnknownRegion { node: op.node, region },
            Refusal::OutOfBounds { region_len } => {
                Error::OutOfBounds { region, offset: op.offset, len: op.len, region_len }
            }
            Refusal::Misaligned => Error::Misaligned { offset: op.offset },
            Refusal::TooLarge => Error::MessageTooLarge { len: op.len as usize, max: crate::MESSAGE_BYTES_MAX },
            Refusal::Busy => Error::Busy { region },
            Refusal::Other(code) => Error::Protocol(format!("refused with code {code}, unknown to this build")),
        }
    }
}

/// A management-host error, carried as text so [`Error`] stays `Clone + Eq`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("management host: {text}")]
pub struct MhErrorText {
    /// Whether it was a wrong secret or other refusal (`true`) rather than unavailability.
    pub denied: bool,
    /// Whether the thing looked up does not exist.
    pub not_found: bool,
    /// The message.
    pub text: String,
}

impl From<rackwire_mh::MhError> for Error {
    fn from(e: rackwire_mh::MhError) -> Self {
        use rackwire_mh::MhError as M;
        let denied = matches!(e, M::Denied(_) | M::ServerNotAuthentic);
        let not_found = matches!(e, M::NotFound(_));
        if let M::Config(c) = e {
            return Error::Config(c);
        }
        Error::Mh(MhErrorText { denied, not_found, text: e.to_string() })
    }
}

impl From<rackwire_shm::ShmError> for Error {
    fn from(e: rackwire_shm::ShmError) -> Self {
        match e {
            rackwire_shm::ShmError::Sys { op, source } => Error::sys(op, &source),
            e => Error::Sys { op: "shared memory", kind: std::io::ErrorKind::InvalidData, detail: e.to_string() },
        }
    }
}

impl Error {
    /// A system call for `op` failed with `e`.
    pub fn sys(op: &'static str, e: &std::io::Error) -> Error {
        Error::Sys { op, kind: e.kind(), detail: e.to_string() }
    }

    /// True when the management host refused admission (for example a wrong secret).
    pub fn is_denied(&self) -> bool {
        matches!(self, Error::Mh(m) if m.denied)
    }
}

impl From<ParseAccessError> for Error {
    fn from(e: ParseAccessError) -> Error {
        Error::Config(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a system error keeps its source's type: what was being done and the kind of
    // the kernel's error (here a refused permission), both from an I/O error and from the
    // shared-memory crate's own error, and that its text names both.
    #[test]
    fn system_errors_keep_what_failed_and_its_kind() {
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let e = Error::sys("binding a socket", &denied);
        assert!(matches!(e, Error::Sys { op: "binding a socket", kind: std::io::ErrorKind::PermissionDenied, .. }));
        assert!(e.to_string().starts_with("system: binding a socket: "), "{e}");
        let shm =
            rackwire_shm::ShmError::Sys { op: "mmap", source: std::io::Error::from(std::io::ErrorKind::OutOfMemory) };
        assert!(matches!(Error::from(shm), Error::Sys { op: "mmap", kind: std::io::ErrorKind::OutOfMemory, .. }));
    }

    // Checks the grouping by hand for one error of each kind: access refusals (a missing
    // grant, a range past the end) are `Refused`, a gone peer and a timeout `Lost`, a bad
    // configuration and a message past its limit `BadUse`, a full queue `Limit`, a wrong
    // secret `ManagementHost`, a
    // failed system call `System`, a moving region `TryAgain`, a closed fabric `Closed`.
    #[test]
    fn each_error_has_the_kind_a_caller_acts_on() {
        let cases = [
            (Error::Ungranted { region: 1, needed: Access::WRITE }, ErrorKind::Refused),
            (Error::OutOfBounds { region: 1, offset: 8, len: 8, region_len: 8 }, ErrorKind::Refused),
            (Error::PeerGone(3), ErrorKind::Lost),
            (Error::Timeout, ErrorKind::Lost),
            (Error::Config("no links".into()), ErrorKind::BadUse),
            (Error::MessageTooLarge { len: 1 << 20, max: 1 << 16 }, ErrorKind::BadUse),
            (Error::Limit(Limit::DatagramQueue), ErrorKind::Limit),
            (
                Error::Mh(MhErrorText { denied: true, not_found: false, text: "wrong secret".into() }),
                ErrorKind::ManagementHost,
            ),
            (Error::sys("mmap", &std::io::Error::from(std::io::ErrorKind::OutOfMemory)), ErrorKind::System),
            (Error::Busy { region: 1 }, ErrorKind::TryAgain),
            (Error::Closed, ErrorKind::Closed),
        ];
        for (e, kind) in cases {
            assert_eq!(e.kind(), kind, "{e}");
        }
    }

    // Checks that a limit says which limit and its bound: a batch past the largest names the
    // entries asked for and the most allowed, the region table names its size, and a caller
    // can match the limit it met rather than read a text.
    #[test]
    fn a_limit_says_which_and_how_far() {
        let e = Error::Limit(Limit::BatchEntries { n: crate::BATCH_ENTRIES_MAX + 1 });
        assert_eq!(
            e.to_string(),
            format!(
                "limit reached: {} batch entries, at most {}",
                crate::BATCH_ENTRIES_MAX + 1,
                crate::BATCH_ENTRIES_MAX
            )
        );
        assert_eq!(Error::Limit(Limit::Regions).to_string(), format!("limit reached: {} regions", crate::REGIONS_MAX));
        assert!(matches!(e, Error::Limit(Limit::BatchEntries { .. })));
    }
}
