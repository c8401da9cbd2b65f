//! Datagrams: bytes sent in one frame of their own, at most once, never acknowledged nor sent
//! again, delivered as messages are (and counted against the same room) when they arrive.
//!
//! A packet of a network that has its own recovery (an IP packet through the virtual NIC: TCP
//! resends what is lost, UDP programs expect loss) needs none from the transport, and a copy
//! kept for a retransmission, an operation to complete and an acknowledgement to send would be
//! work on every packet's path for nothing; a lost packet sent again by both the transport and
//! the TCP inside it is sent twice. A datagram frame is sealed, checked against replays,
//! striped over the links and carries the cumulative acknowledgement as every frame does; it
//! takes no sequence number, so it neither opens a gap nor fills one.

use rackwire_wire::FrameKind;

use super::{Connection, Event, FrameBufs, SplitTransmit, State};
use crate::{OpError, Time};

/// Datagrams waiting to be sent on one connection; past it the newest is refused (a NIC's
/// queue drops as it overflows).
pub const DATAGRAMS_QUEUED_MAX: usize = 256;

/// Buffers of datagrams sent kept for the next ones.
const DATAGRAM_BUFS_KEPT: usize = 2;

impl Connection {
    /// The largest datagram this connection sends: one data frame's payload (which may
    /// shrink once, when the path proves to carry less than agreed: see [`Event::PathCut`]).
    pub fn datagram_max(&self) -> usize {
        self.data_payload_max()
    }

    /// Queue `data` to go in a frame of its own (see the module documentation). Refused with
    /// [`OpError::Limit`] if larger than [`Connection::datagram_max`] or if
    /// [`DATAGRAMS_QUEUED_MAX`] wait already (counted as dropped), with [`OpError::Closed`] once
    /// closed, and with [`OpError::NotConnected`] before the handshake is over (a datagram is not
    /// kept for later).
    pub fn send_datagram(&mut self, data: &[u8]) -> Result<(), OpError> {
        match self.state {
            State::Closed(_) => return Err(OpError::Closed),
            State::Handshaking => return Err(OpError::NotConnected),
            State::Established => {}
        }
        if data.len() > self.datagram_max() {
            return Err(OpError::Limit);
        }
        if self.datagrams.len() >= DATAGRAMS_QUEUED_MAX {
            self.stats.datagrams_dropped += 1;
            return Err(OpError::Limit);
        }
        // Into a buffer a datagram sent before left behind, if one is there: no allocation
        // per datagram once a few went out.
        let mut buf = self.datagram_bufs.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        self.datagrams.push_back(buf);
        Ok(())
    }

    /// Send `data` as a datagram now: its frame is written straight from `data` into the buffer
    /// `bufs` gives for its link, ahead of anything else this connection has to send (the
    /// next [`Connection::poll_transmit_to`] sends that). A driver that sends a packet the
    /// moment it has it so neither copies it into the queue nor looks at every other kind of
    /// frame before it goes out. `Ok(None)`: queued instead, as [`Connection::send_datagram`]
    /// queues, behind datagrams queued before it (they keep their order), until a link is up,
    /// or behind a handshake frame still to go; or dropped (and counted) when the buffer given
    /// is too small for its frame. Refused as [`Connection::send_datagram`] refuses.
    pub fn send_datagram_now(
        &mut self,
        now: Time,
        data: &[u8],
        bufs: &mut dyn FrameBufs,
    ) -> Result<Option<SplitTransmit>, OpError> {
        let link = match self.state {
            // Not ahead of a handshake frame still to go (the peer would drop what came first).
            State::Established
                if self.datagrams.is_empty() && self.hs_send.is_none() && data.len() <= self.datagram_max() =>
            {
                self.pick_link(None).or_else(|| self.any_link_up())
            }
            _ => None,
        };
        let Some(link) = link else { return self.send_datagram(data).map(|()| None) };
        let t = self.emit_datagram(now, bufs, link, data);
        self.check_invariants();
        Ok(t)
    }

    /// The next queued datagram's frame, on the link a data frame would take now (or any link
    /// up: a datagram does not wait for a window).
    pub(super) fn poll_datagram(&mut self, now: Time, bufs: &mut dyn FrameBufs) -> Option<SplitTransmit> {
        self.datagrams.front()?;
        let link = self.pick_link(None).or_else(|| self.any_link_up())?;
        let data = self.datagrams.pop_front().expect("looked at");
        let t = self.emit_datagram(now, bufs, link, &data);
        if self.datagram_bufs.len() < DATAGRAM_BUFS_KEPT {
            self.datagram_bufs.push(data);
        }
        t
    }

    fn emit_datagram(
        &mut self,
        now: Time,
        bufs: &mut dyn FrameBufs,
        link: usize,
        data: &[u8],
    ) -> Option<SplitTransmit> {
        let t = self.emit(now, bufs, link, FrameKind::Datagram, 0, data.len(), |p| p.copy_from_slice(data));
        // A frame that does not fit the link's buffer (never, within `datagram_max`) drops it.
        match t {
            Some(_) => self.stats.datagrams_sent += 1,
            None => self.stats.datagrams_dropped += 1,
        }
        t
    }

    /// A datagram arrived: handed over as a message, if the application's queues have room
    /// (else dropped, and counted).
    pub(super) fn on_datagram(&mut self, payload: &[u8]) {
        if !self.room.takes(payload.len(), 0) {
            self.stats.datagrams_dropped += 1;
            return;
        }
        self.room.take(payload.len(), 0);
        self.stats.datagrams_received += 1;
        self.events.push_back(Event::Message { data: payload.to_vec() });
    }
}
