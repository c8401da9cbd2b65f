//! A connection's counters: what every transport counts, and what only one does.

/// Counters of one connection: its operations, which every transport counts (each field says
/// where they count differently), and the counters of the transport that carries it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConnStats {
    /// One-sided writes completed, as the transport carried them: over shared memory a batch
    /// or a write with a signal counts once; over the edge transport each entry of a batch,
    /// and a signal apart from its data.
    pub writes: u64,
    /// One-sided reads.
    pub reads: u64,
    /// Atomics.
    pub atomics: u64,
    /// Payload bytes written.
    pub bytes_written: u64,
    /// Payload bytes read.
    pub bytes_read: u64,
    /// Messages sent.
    pub messages_sent: u64,
    /// Notifications sent.
    pub notifications_sent: u64,
    /// Operations refused (access, bounds, key).
    pub refused: u64,
    /// Shared memory's own counters (a connection over shared memory).
    #[serde(flatten)]
    pub shm: Option<ShmStats>,
    /// The edge transport's own counters (a connection over the edge transport).
    #[serde(flatten)]
    pub edge: Option<EdgeStats>,
}

/// What only the shared-memory transport counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShmStats {
    /// Times a sender found the peer's ring full and had to wait.
    pub ring_full_waits: u64,
    /// Doorbells that needed a system call (the rest were coalesced).
    pub doorbells: u64,
    /// Remote regions mapped.
    pub mappings: u64,
}

/// What only the edge transport counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EdgeStats {
    /// Frames sent (all kinds).
    pub frames_sent: u64,
    /// Valid frames received.
    pub frames_received: u64,
    /// Data frames sent for the first time.
    pub data_frames: u64,
    /// Data frames sent again.
    pub retransmits: u64,
    /// Data frames that arrived beyond a gap.
    pub out_of_order: u64,
    /// Of those, frames that waited for the gap to close before acting (delivery in order,
    /// [`crate::FabricConfig::in_order`]).
    pub held: u64,
    /// Data frames that arrived twice.
    pub duplicates: u64,
    /// Explicit acknowledgements sent.
    pub acks_sent: u64,
    /// Negative acknowledgements sent.
    pub nacks_sent: u64,
    /// Frames dropped as damaged or malformed.
    pub malformed: u64,
    /// Data frames dropped unacknowledged (sent again later) because the
    /// application had not read enough of its messages or notifications to take them.
    pub receiver_full: u64,
    /// Data frames declared lost (each is sent again).
    pub losses: u64,
    /// Of those, declared lost by the retransmission timer.
    pub loss_timeouts: u64,
    /// Link window cuts.
    pub window_cuts: u64,
    /// Window cuts undone because their losses proved spurious.
    pub cuts_undone: u64,
    /// The largest frame, as agreed with the peer in the handshake (the
    /// smaller of the two ends' link MTUs less IP and UDP headers).
    pub frame_max: u64,
    /// The longest frame the path to the peer proved to carry on every link
    /// that carries data (padded probes, once connected; 0 while searching): data frames are at
    /// most this long, less than `frame_max` where a switch on the way carries less.
    pub path_frame_max: u64,
    /// Whether the connection's frames are sealed (encrypted and
    /// authenticated under keys only its two ends hold).
    pub sealed: bool,
    /// Frames dropped because their authentication tag did not hold (forged,
    /// damaged, or sealed under other keys).
    pub forged: u64,
    /// Sealed frames dropped because they were taken before (replays).
    pub replayed: u64,
    /// Frames dropped because they came unsealed on a sealed connection.
    pub unsealed: u64,
    /// Unsealed frames that proved nothing (a handshake step in the peer's
    /// name whose proof does not hold, a close before the keys): ignored, nothing changed.
    pub unproven: u64,
    /// Retries a busy peer asked of this end's handshake (each one Hello
    /// sent again, with the peer's token).
    pub retries: u64,
    /// Datagrams sent, each in a frame of its own (see
    /// [`crate::Conn::send_datagram`]; over shared memory they count as messages).
    pub datagrams_sent: u64,
    /// Datagrams received and handed over as messages.
    pub datagrams_received: u64,
    /// Datagrams dropped: refused for a full queue on sending, or without
    /// room for them among the messages not yet read on receiving.
    pub datagrams_dropped: u64,
    /// This end's id for the connection (every frame to it carries it in its
    /// header; chosen at random per node run).
    pub conn_id: u32,
}

impl ConnStats {
    /// The edge transport's counters, zero for a connection over shared memory.
    pub fn edge_or_zero(&self) -> EdgeStats {
        self.edge.unwrap_or_default()
    }
}
