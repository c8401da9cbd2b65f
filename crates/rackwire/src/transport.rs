//! The seam between the public API and the transports.
//!
//! A [`PeerTransport`] is one live connection to one peer. The shared-memory transport
//! implements it for peers that share this host's memory; the edge transport (reliable,
//! multi-link, over Ethernet) implements it for the rest. [`crate::Conn`] is a thin wrapper, so
//! applications see the same calls, the same [`crate::Op`] handles and the same errors on both.
//!
//! What every implementation must guarantee:
//!
//! - **Access is the target's decision.** An operation reaches the target's memory only if the
//!   target's grant table ([`crate::grants::RegionTable`]) allows it: key, grant and bounds. A
//!   refused operation completes with its own error ([`crate::Error::Ungranted`],
//!   [`crate::Error::Revoked`], [`crate::Error::BadKey`], [`crate::Error::OutOfBounds`],
//!   [`crate::Error::Misaligned`], [`crate::Error::UnknownRegion`]) and touches nothing.
//! - **Notifications follow data.** A notification is delivered only after every byte of its
//!   operation is visible in the target's memory.
//! - **Fences.** A `fence_before` operation starts after every earlier operation on the
//!   connection completed; after a `fence_after` operation, later ones start only once it
//!   completed. Without fences, operations may complete in any order.
//! - **Completion means placed.** An operation completes successfully only once its effect is
//!   in the target's memory (for reads: the data is in the returned buffer).
//! - **Peer loss is an error, not a hang.** Operations on a connection whose peer is gone
//!   complete with [`crate::Error::PeerGone`]; waiting is bounded by the configured timeout.

use bytes::Bytes;
use std::time::Duration;

use crate::op::{BatchOptions, Notification, Op, OpFlags, Signal};
use crate::stats::ConnStats;
use crate::{Error, NodeId, RegionId, RemoteRegion};

/// One live connection to one peer, over some transport.
pub(crate) trait PeerTransport: Send + Sync + 'static {
    /// The peer's node id.
    fn peer(&self) -> NodeId;
    /// A short name of the transport (`shm`, `udp`).
    fn kind(&self) -> &'static str;
    /// False once the peer is gone or the connection was cut.
    fn is_alive(&self) -> bool;
    /// One-sided write of `data` at `offset` of `target`.
    fn write(&self, target: &RemoteRegion, offset: u64, data: &[u8], flags: OpFlags) -> Op;
    /// [`PeerTransport::write`] of bytes the transport may keep instead of copying.
    fn write_bytes(&self, target: &RemoteRegion, offset: u64, data: Bytes, flags: OpFlags) -> Op {
        self.write(target, offset, &data, flags)
    }
    /// One-sided scatter-gather write: each `(offset, bytes)` of `entries` into `target`.
    fn write_batch(&self, target: &RemoteRegion, entries: &[(u64, &[u8])], flags: OpFlags, opts: BatchOptions) -> Op;
    /// One-sided read of `len` bytes at `offset` of `target`.
    fn read(&self, target: &RemoteRegion, offset: u64, len: u64, flags: OpFlags) -> Op;
    /// 64-bit compare-and-swap at an 8-byte aligned `offset`; yields the old value.
    fn compare_swap(&self, target: &RemoteRegion, offset: u64, expected: u64, new: u64, flags: OpFlags) -> Op;
    /// 64-bit fetch-and-add at an 8-byte aligned `offset`; yields the old value.
    fn fetch_add(&self, target: &RemoteRegion, offset: u64, add: u64, flags: OpFlags) -> Op;
    /// One-sided write of `data` (possibly empty), then `signal` applied once every byte of it
    /// is placed (`signal.offset` is 8-byte aligned). The notification, if asked for, follows
    /// the signal.
    fn write_signal(&self, target: &RemoteRegion, offset: u64, data: &[u8], signal: Signal, flags: OpFlags) -> Op;
    /// Two-sided message, at most [`crate::MESSAGE_BYTES_MAX`] bytes.
    fn send(&self, msg: &[u8]) -> Op;
    /// A message `fill` writes into up to `max` bytes, sent with the length it returns (see
    /// [`crate::Conn::send_with`]); `None` when it returns `None`. Here through a buffer; a
    /// transport that can gives `fill` the peer's memory itself.
    fn send_with(&self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Option<Op> {
        let mut buf = vec![0u8; max];
        let len = fill(&mut buf).filter(|&n| n <= max)?;
        Some(self.send(&buf[..len]))
    }
    /// A datagram (see [`crate::Conn::send_datagram`]). Here as a message that waits for no
    /// room and whose completion nobody asks for; the edge transport sends a frame of its own.
    fn send_datagram(&self, msg: &[u8]) -> Result<(), Error> {
        let op = self.send_with(msg.len(), &mut |buf| {
            buf[..msg.len()].copy_from_slice(msg);
            Some(msg.len())
        });
        match op.map(|mut op| op.poll()) {
            None => Err(Error::Limit(crate::Limit::PeerRing)),
            Some(Some(Err(e))) => Err(e),
            Some(_) => Ok(()),
        }
    }
    /// A datagram with more to follow at once (see [`crate::Conn::send_datagram_more`]). Here
    /// as [`PeerTransport::send_datagram`]: only the edge transport holds it back.
    fn send_datagram_more(&self, msg: &[u8]) -> Result<(), Error> {
        self.send_datagram(msg)
    }
    /// Send the datagrams held back (see [`crate::Conn::send_held`]). Here nothing is.
    fn send_held(&self) {}
    /// Take the next message from this peer into `out`, if one is waiting.
    fn try_recv(&self, out: &mut Vec<u8>) -> Result<bool, Error>;
    /// Hand the next message from this peer to `f` (where the transport holds it, if it can,
    /// without a copy), if one is waiting.
    fn try_recv_with(&self, f: &mut dyn FnMut(&[u8])) -> Result<bool, Error> {
        let mut buf = Vec::new();
        let got = self.try_recv(&mut buf)?;
        if got {
            f(&buf);
        }
        Ok(got)
    }
    /// Take the next notification from this peer, if one is waiting.
    fn try_notification(&self) -> Result<Option<Notification>, Error>;

    /// Messages or notifications this connection delivered wait to be taken.
    fn unread(&self) -> bool {
        false
    }
    /// Pin `target` for one thread's lock-free writes ([`crate::Conn::pin`]); only where the
    /// peer's memory is mapped into this process.
    fn pin(&self, target: &RemoteRegion, need: crate::Access) -> Result<crate::Pinned, Error> {
        let _ = (target, need);
        Err(Error::Config(format!("pinning needs a shared-memory connection, not {}", self.kind())))
    }
    /// Ask the peer to stop using `region` of ours, and wait up to `timeout` for its word.
    /// True when it confirmed (or never used it); false when it did not answer in time.
    fn unmap(&self, region: RegionId, timeout: Duration) -> bool;
    /// Tear the connection down now; the peer sees it as gone.
    fn cut_off(&self);
    /// Counters.
    fn stats(&self) -> ConnStats;
    /// Counters of each link (the edge transport; none for shared memory).
    fn link_stats(&self) -> Vec<rackwire_proto::LinkStats> {
        Vec::new()
    }
}
