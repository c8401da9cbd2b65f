//! Counters, per connection and per link.

/// Counters of one link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames sent on it.
    pub frames_sent: u64,
    /// Bytes sent on it.
    pub bytes_sent: u64,
    /// Valid frames received on it.
    pub frames_received: u64,
    /// Bytes received on it.
    pub bytes_received: u64,
    /// Data frames resent on it.
    pub retransmits: u64,
    /// Frames declared lost that were sent on it.
    pub losses: u64,
    /// Of those, declared lost by the retransmission timer.
    pub timeouts: u64,
    /// Times its window was cut (at most once per round trip).
    pub cuts: u64,
    /// Window cuts undone because every retransmission behind them proved unneeded.
    pub undone_cuts: u64,
    /// Probes sent on it.
    pub probes: u64,
    /// Times it went down.
    pub downs: u64,
    /// Smoothed round trip, µs.
    pub srtt_us: u64,
    /// Quickest round trip measured, µs (what a lone frame's choice of link goes by).
    pub min_rtt_us: u64,
    /// Current window, frames.
    pub window: u64,
    /// The longest frame proven to cross it both ways, bytes (0: not proven yet).
    pub path_frame_max: u64,
}

/// Counters of one connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Frames sent (all kinds).
    pub frames_sent: u64,
    /// Bytes sent (all kinds, headers included).
    pub bytes_sent: u64,
    /// Valid frames received.
    pub frames_received: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// Data frames sent for the first time.
    pub data_frames: u64,
    /// Data frames sent again.
    pub retransmits: u64,
    /// Data frames that arrived beyond a gap.
    pub out_of_order: u64,
    /// Data frames that arrived again.
    pub duplicates: u64,
    /// Explicit acknowledgement frames sent.
    pub acks_sent: u64,
    /// Negative acknowledgement frames sent.
    pub nacks_sent: u64,
    /// Frames dropped as malformed or damaged.
    pub malformed: u64,
    /// Sealed frames whose tag did not hold (damaged, forged, or sealed under other keys):
    /// dropped before anything in them was looked at.
    pub forged: u64,
    /// Sealed frames taken before (or older than the replay window): dropped.
    pub replayed: u64,
    /// Frames that came unsealed on a connection whose frames are sealed: dropped.
    pub unsealed: u64,
    /// Handshakes refused: a wrong fabric-secret proof, or a signature not by the peer's key.
    pub handshakes_refused: u64,
    /// Unsealed frames that proved nothing (a handshake step whose confirmation or signature
    /// does not hold, a close or another frame before the keys): ignored, the connection and
    /// its handshake go on.
    pub unproven: u64,
    /// Retries a busy acceptor asked of this end's handshake (each one Hello sent again).
    pub retries: u64,
    /// Answers sent riding ahead of another segment instead of in frames of their own.
    pub answers_packed: u64,
    /// Operations sent whole in a frame behind another operation's segment instead of in a
    /// frame of their own.
    pub ops_chained: u64,
    /// Later write fragments kept until their operation's first fragment arrived.
    pub stashed: u64,
    /// Later write fragments dropped unacknowledged because the stash was full.
    pub stash_full: u64,
    /// Data frames that waited for a frame sent before them (delivery in order).
    pub held: u64,
    /// Data frames dropped unacknowledged because the application's queues had no room for
    /// what they carried (see [`crate::Connection::set_delivery_room`]).
    pub receiver_full: u64,
    /// Operations the target refused (counted at the initiator).
    pub refused: u64,
    /// Operations the target refused (counted at the target).
    pub refused_here: u64,
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// Datagrams received and handed over.
    pub datagrams_received: u64,
    /// Datagrams dropped: at the sender, its queue full; at the receiver, no room in the
    /// application's queues.
    pub datagrams_dropped: u64,
    /// Writes of this end the target placed (each whole write once).
    pub writes: u64,
    /// Payload bytes of those writes.
    pub bytes_written: u64,
    /// Of those writes, the ones that raised a notification at the target.
    pub notifications_sent: u64,
    /// Reads of this end answered with their data.
    pub reads: u64,
    /// Their bytes.
    pub bytes_read: u64,
    /// Atomics of this end answered.
    pub atomics: u64,
    /// Messages of this end delivered.
    pub messages_sent: u64,
    /// The frame length data goes in once the path is searched, bytes (0: still searching).
    pub path_frame_max: u64,
    /// Per link.
    pub links: Vec<LinkStats>,
}

impl ConnStats {
    /// Share of data frames that were extra (retransmissions), 0..1.
    pub fn extra_share(&self) -> f64 {
        if self.data_frames == 0 {
            0.0
        } else {
            self.retransmits as f64 / (self.data_frames + self.retransmits) as f64
        }
    }
    /// Share of received data frames that arrived out of order, 0..1.
    pub fn out_of_order_share(&self) -> f64 {
        let rx: u64 = self.links.iter().map(|l| l.frames_received).sum();
        if rx == 0 {
            0.0
        } else {
            self.out_of_order as f64 / rx as f64
        }
    }
}
