//! The error type of groups and collectives.

/// What can go wrong in a group call. Every failure of a peer is reported by the rank that
/// saw it, naming the rank; a group call never hangs past the group's timeout.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CollError {
    /// The fabric refused or failed an operation (see the inner error).
    #[error(transparent)]
    Fabric(#[from] rackwire::Error),
    /// A rank of the group is gone (its process ended or its connection was cut): the group
    /// cannot go on. Start the job again.
    #[error("rank {rank} (node {node}) of the group is gone")]
    RankGone {
        /// The rank.
        rank: usize,
        /// Its node.
        node: rackwire::NodeId,
    },
    /// Ranks did not take their part in time (they are stuck, far behind, or never started).
    #[error("timed out after {waited_ms} ms waiting for rank(s) {ranks:?} in {during}")]
    Timeout {
        /// What the group was doing.
        during: &'static str,
        /// The ranks it was waiting for.
        ranks: Vec<usize>,
        /// How long it waited.
        waited_ms: u64,
    },
    /// A size or count past a limit of this crate.
    #[error("limit: {0}")]
    Limit(String),
    /// Arguments that do not fit together (lengths, counts, roots).
    #[error("bad argument: {0}")]
    BadArgument(String),
    /// Bad configuration (environment, job name, rank or size).
    #[error("configuration: {0}")]
    Config(String),
}
