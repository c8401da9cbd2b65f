//! Connection parameters.

use crate::{Time, LINKS_MAX, WINDOW_FRAMES_MAX};
use rackwire_wire::payload::FRAME_LEN_MIN;
use rackwire_wire::HEADER_LEN;

/// Parameters of a connection; every bound is explicit. Times in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Links this node has toward the peer (1..=[`LINKS_MAX`]).
    pub links: usize,
    /// Largest frame per link, bytes (the link MTU less IP and UDP headers).
    pub mtu: Vec<usize>,
    /// Most frames in flight on the connection.
    pub window_frames_max: usize,
    /// Most frames in flight on one link.
    pub link_window_max: usize,
    /// Smallest per-link window (the floor loss cannot push it under).
    pub link_window_min: usize,
    /// Per-link window at start.
    pub link_window_initial: usize,
    /// Retransmission timeout bounds and start.
    pub rto_min_us: Time,
    /// Upper bound of the retransmission timeout (back-off stops here).
    pub rto_max_us: Time,
    /// Retransmission timeout before any round trip was measured.
    pub rto_initial_us: Time,
    /// Acknowledge at least every this many data frames.
    pub ack_every_frames: u32,
    /// Acknowledge at the latest this long after an unacknowledged data frame.
    pub ack_delay_us: Time,
    /// Slack added to a link's round trip before a frame overtaken by later ones counts as lost.
    pub reorder_slack_us: Time,
    /// Probe a link silent for this long.
    pub probe_interval_us: Time,
    /// A probe not answered within this long is missed.
    pub probe_timeout_us: Time,
    /// Missed probes after which a link is down.
    pub probes_missed_max: u32,
    /// The peer timeout: close when nothing was heard on any link for this long. Until then
    /// the peer is only unreachable: links that stopped answering are probed every
    /// [`Config::probe_interval_us`] and used again as soon as one answers, and operations
    /// wait (within [`Config::op_timeout_us`]). Well above a switch's reboot blips.
    pub idle_timeout_us: Time,
    /// Fail an operation not completed within this long.
    pub op_timeout_us: Time,
    /// Retransmit handshake frames this often (the initiator's; an acceptor answers each
    /// first frame it gets once, and sends nothing on its own, so a spoofed first frame gets
    /// at most one frame of its size back).
    pub handshake_retry_us: Time,
    /// Close a connection whose handshake has not completed and that heard nothing for this
    /// long (an acceptor keeps state for a spoofed first frame no longer than this).
    pub handshake_timeout_us: Time,
    /// Deliver data frames to the target strictly in the order they were sent (MultiEdge's
    /// ordered links): a frame that arrives beyond a gap waits, whole, until every frame sent
    /// before it has arrived (at most [`crate::IN_ORDER_HELD_MAX`] wait; one more is dropped
    /// unacknowledged and sent again). Off: frames act as they arrive, and operations complete
    /// in any order.
    pub in_order: bool,
}

impl Config {
    /// Defaults for `links` links of one MTU.
    pub fn new(links: usize, mtu: usize) -> Self {
        Config {
            links,
            mtu: vec![mtu; links],
            window_frames_max: 2048,
            link_window_max: 1024,
            link_window_min: 16,
            link_window_initial: 64,
            rto_min_us: 1_000,
            rto_max_us: 200_000,
            rto_initial_us: 20_000,
            ack_every_frames: 8,
            ack_delay_us: 200,
            reorder_slack_us: 500,
            probe_interval_us: 20_000,
            probe_timeout_us: 20_000,
            probes_missed_max: 3,
            idle_timeout_us: 10_000_000,
            op_timeout_us: 10_000_000,
            handshake_retry_us: 20_000,
            handshake_timeout_us: 5_000_000,
            in_order: false,
        }
    }

    /// Check the parameters; says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=LINKS_MAX).contains(&self.links) || self.mtu.len() != self.links {
            return Err(format!("links must be 1..={LINKS_MAX} with one MTU each"));
        }
        if let Some(m) = self.mtu.iter().find(|&&m| !(FRAME_LEN_MIN..=65507).contains(&m)) {
            return Err(format!("MTU {m} outside {FRAME_LEN_MIN}..=65507"));
        }
        if !(1..=WINDOW_FRAMES_MAX).contains(&self.window_frames_max) {
            return Err(format!("window_frames_max must be 1..={WINDOW_FRAMES_MAX}"));
        }
        if !(self.link_window_min >= 1
            && self.link_window_min <= self.link_window_initial
            && self.link_window_initial <= self.link_window_max)
        {
            return Err("link windows must satisfy 1 <= min <= initial <= max".into());
        }
        if !(self.rto_min_us > 0 && self.rto_min_us <= self.rto_initial_us && self.rto_initial_us <= self.rto_max_us) {
            return Err("retransmission timeouts must satisfy 0 < min <= initial <= max".into());
        }
        if self.ack_every_frames == 0 || self.probes_missed_max == 0 {
            return Err("ack_every_frames and probes_missed_max must be at least 1".into());
        }
        if self.handshake_retry_us == 0 || self.handshake_timeout_us <= self.handshake_retry_us {
            return Err("handshake timeouts must satisfy 0 < retry < timeout".into());
        }
        Ok(())
    }

    /// Payload bytes (segment header and body) a data frame carries on `link`.
    pub fn payload_max(&self, link: usize) -> usize {
        self.mtu[link] - HEADER_LEN
    }
}
