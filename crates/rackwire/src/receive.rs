//! Incoming traffic as one node takes it: messages and notifications from any peer, waits for
//! them, and an application's own event loop on the node's doorbell.

use std::time::Duration;

use tracing::warn;

use crate::node::{poll_until, Peer, PeerView};
use crate::op::Notification;
use crate::{Error, Fabric, NodeId};

/// A message from a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Sender.
    pub from: NodeId,
    /// Payload.
    pub data: Vec<u8>,
}

/// A standing view of a node's peers for a loop that takes messages ([`Fabric::receiver`]).
pub struct Receiver {
    view: PeerView,
}

impl Fabric {
    /// The next message from any peer, if one is waiting.
    pub fn try_recv(&self) -> Result<Option<Message>, Error> {
        self.look_for_message(&mut self.inner.peer_view())
    }

    /// The next message from any peer, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Message, Error> {
        let mut view = self.inner.peer_view();
        poll_until(&self.inner, timeout, || self.look_for_message(&mut view))
    }

    fn look_for_message(&self, view: &mut PeerView) -> Result<Option<Message>, Error> {
        let mut data = Vec::new();
        let from = self.poll_peers(view, |p| p.try_recv(&mut data).map(|got| got.then_some(())))?;
        Ok(from.map(|(from, ())| Message { from, data }))
    }

    /// The next message from any peer, handed to `f` with its sender where the transport
    /// holds it (in the shared-memory ring, without a copy), waiting at most `timeout`.
    pub fn recv_with(&self, timeout: Duration, mut f: impl FnMut(NodeId, &[u8])) -> Result<NodeId, Error> {
        let mut view = self.inner.peer_view();
        poll_until(&self.inner, timeout, || {
            self.poll_peers(&mut view, |p| {
                let from = p.peer();
                p.try_recv_with(&mut |data| f(from, data)).map(|got| got.then_some(()))
            })
        })
        .map(|(from, ())| from)
    }

    /// Take up to `max` messages that are waiting now, from any peers, each handed to `f` with
    /// its sender where the transport holds it (as [`Fabric::recv_with`]), without waiting.
    /// Returns how many were taken. With [`Fabric::wait_input`], one thread serves the
    /// fabric's messages and a device of its own (the virtual NIC's TUN) alike.
    pub fn recv_waiting_with(&self, max: usize, f: impl FnMut(NodeId, &[u8])) -> Result<usize, Error> {
        self.recv_waiting_into(&mut self.receiver(), max, f)
    }

    /// A standing view of this node's peers, for a loop that takes messages over and over
    /// ([`Fabric::recv_waiting_into`]): a snapshot of the peers costs a lock and a reference
    /// count; a standing one is brought up to date only when the peers change (one load).
    pub fn receiver(&self) -> Receiver {
        Receiver { view: self.inner.peer_view() }
    }

    /// [`Fabric::recv_waiting_with`] through the standing view `r` (from [`Fabric::receiver`]
    /// of this fabric).
    pub fn recv_waiting_into(
        &self,
        r: &mut Receiver,
        max: usize,
        mut f: impl FnMut(NodeId, &[u8]),
    ) -> Result<usize, Error> {
        self.recv_waiting_from(
            r,
            max,
            |_| true,
            |n, d| {
                f(n, d);
                true
            },
        )
    }

    /// [`Fabric::recv_waiting_into`], taking messages only from the peers `accept` takes (the
    /// others' wait where they are, in their rings or their connections' queues, in order, for
    /// a later call, and hold no one else's up), until `f` says it has what it needs (returns
    /// false): a caller handed the message it waited for goes back at once, as a ping-pong's
    /// does, and its reply carries the acknowledgement the edge transport holds for it (a
    /// further look would send that on its own).
    pub fn recv_waiting_from(
        &self,
        r: &mut Receiver,
        max: usize,
        mut accept: impl FnMut(NodeId) -> bool,
        mut f: impl FnMut(NodeId, &[u8]) -> bool,
    ) -> Result<usize, Error> {
        let view = &mut r.view;
        let mut taken = 0;
        let mut more = true;
        while taken < max && more {
            let got = self.poll_peers(view, |p| {
                let from = p.peer();
                if !accept(from) {
                    return Ok(None);
                }
                p.try_recv_with(&mut |data| more = f(from, data)).map(|got| got.then_some(()))
            })?;
            if got.is_none() {
                break;
            }
            taken += 1;
        }
        Ok(taken)
    }

    /// Sleep until a message or notification may be waiting for the receive calls, one of
    /// `fds` is readable (at most [`rackwire_shm::doorbell::WAIT_FDS_MAX`]), or `timeout`
    /// passes; returns at once when one waits already. A wake-up says only "look": the caller
    /// looks (with [`Fabric::recv_waiting_with`], and at its descriptors) before it sleeps again.
    pub fn wait_input(&self, fds: &[std::os::fd::BorrowedFd<'_>], timeout: Duration) -> Result<(), Error> {
        crate::node::wait_input(&self.inner, fds, timeout)
    }

    /// The descriptor that turns readable when input may wait for the receive calls (this
    /// node's doorbell), for an application's own event loop: [`Fabric::arm_input`] before it
    /// sleeps on it (and does not sleep when that says input waits), [`Fabric::disarm_input`]
    /// once awake, then the receive calls. A wake-up says only "look".
    pub fn input_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.doorbell.fd()
    }

    /// Arm this node's doorbell for a sleep on [`Fabric::input_fd`] (peers ring it from now on,
    /// and the edge transport's network thread takes over its links); true when input waits
    /// already, so the caller should look instead of sleeping (the doorbell is disarmed then).
    pub fn arm_input(&self) -> bool {
        self.inner.rest();
        self.inner.doorbell.arm();
        // Looked at after arming: a record published before it is seen here, one after rings.
        let waiting = self.inner.all_peers().iter().any(|p| p.unread());
        if waiting {
            self.inner.doorbell.disarm();
        }
        waiting
    }

    /// Make [`Fabric::input_fd`] readable (a thread of this process that took the input
    /// itself tells the sleeper to look).
    pub fn wake_input(&self) {
        self.inner.doorbell.wake();
    }

    /// Disarm the doorbell after a sleep on [`Fabric::input_fd`] and take its ring.
    pub fn disarm_input(&self) {
        self.inner.doorbell.disarm();
        self.inner.doorbell.drain();
    }

    /// The next notification, if one is waiting.
    pub fn try_notification(&self) -> Result<Option<Notification>, Error> {
        self.look_for_notification(&mut self.inner.peer_view())
    }

    /// The next notification, waiting at most `timeout`.
    pub fn wait_notification(&self, timeout: Duration) -> Result<Notification, Error> {
        let mut view = self.inner.peer_view();
        poll_until(&self.inner, timeout, || self.look_for_notification(&mut view))
    }

    fn look_for_notification(&self, view: &mut PeerView) -> Result<Option<Notification>, Error> {
        Ok(self.poll_peers(view, |p| p.try_notification())?.map(|(_, n)| n))
    }

    /// Look at every peer once, starting at a rotating position so no peer starves. `view`:
    /// the peers as this wait last saw them, brought up to date first if they changed.
    fn poll_peers<T>(
        &self,
        view: &mut PeerView,
        mut f: impl FnMut(&Peer) -> Result<Option<T>, Error>,
    ) -> Result<Option<(NodeId, T)>, Error> {
        self.inner.refresh(view);
        let n = view.peers.len();
        if n == 0 {
            return Ok(None);
        }
        let start = if n > 1 {
            view.next = view.next.wrapping_add(1);
            view.next
        } else {
            0
        };
        let peers = &view.peers;
        for i in 0..n {
            let p = &peers[(start + i) % n];
            match f(p) {
                Ok(Some(v)) => return Ok(Some((p.peer(), v))),
                // A closed connection kept for what it delivered: let it go once taken.
                Ok(None) if !p.is_alive() => self.inner.forget_drained(p),
                Ok(None) => {}
                Err(e) => {
                    warn!(peer = p.peer(), "dropping peer that broke its ring: {e}");
                    p.cut_off();
                }
            }
        }
        Ok(None)
    }
}
