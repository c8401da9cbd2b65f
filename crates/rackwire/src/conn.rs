//! Connections: the one-sided and two-sided calls, whatever the transport.

use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;

use crate::node::{poll_until, Node};
use crate::op::{BatchOptions, Signal};
use crate::transport::PeerTransport;
use crate::{Error, NodeId, Op, OpFlags, RemoteRegion, BATCH_ENTRIES_MAX, MESSAGE_BYTES_MAX};

/// A connection to one peer. Cheap to clone; all calls take `&self` and may be made from
/// several threads.
#[derive(Clone)]
pub struct Conn {
    pub(crate) t: Arc<dyn PeerTransport>,
    pub(crate) fabric: Arc<Node>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("peer", &self.t.peer()).field("transport", &self.t.kind()).finish()
    }
}

impl Conn {
    /// The peer's node id.
    pub fn peer(&self) -> NodeId {
        self.t.peer()
    }

    /// Which transport carries this connection (`shm`, `udp`).
    pub fn transport(&self) -> &'static str {
        self.t.kind()
    }

    /// False once the peer is gone.
    pub fn is_alive(&self) -> bool {
        self.t.is_alive()
    }

    /// Pin `target` (mapping it first if need be, with `need` access) for one thread's
    /// writes with no lock and no completion to track: over shared memory only (elsewhere
    /// [`Error::Config`]). See [`Pinned`](crate::Pinned).
    pub fn pin(&self, target: &RemoteRegion, need: crate::Access) -> Result<crate::Pinned, Error> {
        self.t.pin(target, need)
    }

    /// Write `data` at `offset` of `target`. An 8-byte write at an 8-byte aligned offset is
    /// placed with one store: a reader of that word sees its old or its new value, never a mix.
    pub fn write(&self, target: &RemoteRegion, offset: u64, data: &[u8], flags: OpFlags) -> Op {
        self.t.write(target, offset, data, flags)
    }

    /// [`Conn::write`] of owned bytes: over the edge transport the frames carry `data` itself
    /// until they are acknowledged, with no copy on the way (`Bytes::from(Vec<u8>)` owns a
    /// vector without copying it; a clone shares it). Do not reuse the memory for anything
    /// else meanwhile; `Bytes` rules that out.
    pub fn write_bytes(&self, target: &RemoteRegion, offset: u64, data: Bytes, flags: OpFlags) -> Op {
        self.t.write_bytes(target, offset, data, flags)
    }

    /// Write every `(offset, bytes)` entry into `target` as one operation (scatter-gather);
    /// contiguous entries are combined, large batches spread over the copy channels. With a
    /// notification, the target is notified once, after every entry is placed, naming the
    /// last entry's offset and length.
    pub fn write_batch(&self, target: &RemoteRegion, entries: &[(u64, &[u8])], flags: OpFlags) -> Op {
        self.write_batch_with(target, entries, flags, BatchOptions::default())
    }

    /// [`Conn::write_batch`] with explicit batching options.
    pub fn write_batch_with(
        &self,
        target: &RemoteRegion,
        entries: &[(u64, &[u8])],
        flags: OpFlags,
        opts: BatchOptions,
    ) -> Op {
        if entries.len() > BATCH_ENTRIES_MAX {
            return Op::ready(Err(Error::Limit(crate::Limit::BatchEntries { n: entries.len() })));
        }
        self.t.write_batch(target, entries, flags, opts)
    }

    /// Read `len` bytes at `offset` of `target`.
    pub fn read(&self, target: &RemoteRegion, offset: u64, len: u64, flags: OpFlags) -> Op {
        self.t.read(target, offset, len, flags)
    }

    /// Compare-and-swap the 64-bit word at `offset`: if it equals `expected`, store `new`.
    /// Yields the old value ([`crate::Completion::Value`]).
    pub fn compare_swap(&self, target: &RemoteRegion, offset: u64, expected: u64, new: u64, flags: OpFlags) -> Op {
        self.t.compare_swap(target, offset, expected, new, flags)
    }

    /// Add `add` to the 64-bit word at `offset` (wrapping). Yields the old value.
    pub fn fetch_add(&self, target: &RemoteRegion, offset: u64, add: u64, flags: OpFlags) -> Op {
        self.t.fetch_add(target, offset, add, flags)
    }

    /// Write `data` at `offset` of `target`, then update the signal word: a reader that sees
    /// the signal's new value (with an acquiring load, as [`crate::Region::load_u64`] makes)
    /// also sees every byte of the data. This is the one-sided way to say "a block is here"
    /// (OpenSHMEM's put-with-signal); the data may be empty, leaving just the update. The
    /// reader also sees what every operation made before this one on this connection placed:
    /// a signal may stand for several earlier writes. Over shared memory both are stores by
    /// this thread and the call completes at once; over the edge transport data and update go
    /// together (in one frame when small) and the target applies the update only after the data
    /// and every earlier operation, with no round trip in between. If the write is refused the
    /// operation fails with the write's error (the update may still have been applied).
    pub fn write_signal(&self, target: &RemoteRegion, offset: u64, data: &[u8], signal: Signal, flags: OpFlags) -> Op {
        if !signal.offset.is_multiple_of(8) {
            return Op::ready(Err(Error::Misaligned { offset: signal.offset }));
        }
        self.t.write_signal(target, offset, data, signal, flags)
    }

    /// Send a message of at most [`MESSAGE_BYTES_MAX`] bytes. Completes when it is in the
    /// peer's receive ring.
    pub fn send(&self, msg: &[u8]) -> Op {
        if msg.len() > MESSAGE_BYTES_MAX {
            return Op::ready(Err(Error::MessageTooLarge { len: msg.len(), max: MESSAGE_BYTES_MAX }));
        }
        self.t.send(msg)
    }

    /// Send a message that `fill` writes in place into up to `max` bytes (at most
    /// [`MESSAGE_BYTES_MAX`]), with the length `fill` returns: over shared memory straight
    /// into the peer's receive ring (a device read there needs no buffer and no copy), over
    /// the edge transport through a buffer. `fill` returning `None` sends nothing, and so
    /// does this (`None`); `fill` is not called when the connection fails first (then the
    /// operation says why). It never waits: over shared memory, when the peer's ring has no
    /// room for `max` bytes now, `fill` is not called and nothing is sent (`None`; look again
    /// later), where [`Conn::send`] waits for room. A thread that also drains its own rings (a
    /// relay) must not wait for room in a peer's, which may be waiting for room in its own.
    pub fn send_with(&self, max: usize, fill: impl FnOnce(&mut [u8]) -> Option<usize>) -> Option<Op> {
        if max > MESSAGE_BYTES_MAX {
            return Some(Op::ready(Err(Error::MessageTooLarge { len: max, max: MESSAGE_BYTES_MAX })));
        }
        let mut fill = Some(fill);
        self.t.send_with(max, &mut |buf| fill.take().and_then(|f| f(buf)))
    }

    /// Send `msg` as a datagram: delivered at most once, as a message (taken by
    /// [`Conn::try_recv`] or the edge message handler, in order with the peer's other
    /// messages unless one is lost), or not at all, with nothing to wait for. For traffic
    /// that recovers on its own (IP packets through the virtual NIC): over the edge transport
    /// it goes in a sealed frame of its own, never acknowledged nor sent again, so a lost one
    /// costs no retransmission and nothing waits behind it. Over shared memory, where nothing
    /// is lost, it is a message that does not wait for room. Errors, none of which sends
    /// anything: [`Error::MessageTooLarge`] past one frame's payload (send it with
    /// [`Conn::send`] instead), [`Error::Limit`] when the transport's queue (or the peer's
    /// ring) is full, [`Error::PeerGone`] once the connection failed.
    pub fn send_datagram(&self, msg: &[u8]) -> Result<(), Error> {
        if msg.len() > MESSAGE_BYTES_MAX {
            return Err(Error::MessageTooLarge { len: msg.len(), max: MESSAGE_BYTES_MAX });
        }
        self.t.send_datagram(msg)
    }

    /// Send `msg` as a datagram as [`Conn::send_datagram`] does, with more datagrams to follow
    /// at once (a burst of packets read from a device): the transport may hold it back to send
    /// it with them in one system call, the edge transport's frames of one link as one
    /// offloaded send, at most [`rackwire_udp::SEND_BATCH_MAX`] of them. The next
    /// [`Conn::send_datagram`] takes what is held with it; [`Conn::send_held`] sends it when no
    /// datagram follows after all: a caller that holds datagrams ends with one or the other
    /// (before anything else it sends to the peer, too, if that should not overtake them). Over
    /// shared memory, where a datagram costs no system call, it goes at once.
    pub fn send_datagram_more(&self, msg: &[u8]) -> Result<(), Error> {
        if msg.len() > MESSAGE_BYTES_MAX {
            return Err(Error::MessageTooLarge { len: msg.len(), max: MESSAGE_BYTES_MAX });
        }
        self.t.send_datagram_more(msg)
    }

    /// Send the datagrams [`Conn::send_datagram_more`] held back, if any.
    pub fn send_held(&self) {
        self.t.send_held()
    }

    /// The next message from this peer, if one is waiting.
    pub fn try_recv(&self) -> Result<Option<Vec<u8>>, Error> {
        let mut out = Vec::new();
        Ok(self.t.try_recv(&mut out)?.then_some(out))
    }

    /// The next message from this peer, waiting at most `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        poll_until(&self.fabric, timeout, || {
            if self.t.try_recv(&mut out)? {
                return Ok(Some(()));
            }
            if !self.t.is_alive() {
                return Err(Error::PeerGone(self.t.peer()));
            }
            Ok(None)
        })?;
        Ok(out)
    }

    /// Counters of this connection.
    pub fn stats(&self) -> crate::ConnStats {
        self.t.stats()
    }
}
