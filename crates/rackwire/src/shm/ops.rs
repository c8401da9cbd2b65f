//! The one-sided and two-sided operations over shared memory: stores, loads and atomic
//! instructions on mapped regions, records pushed into the peer's rings.

use rackwire_proto::AtomicOp;

use super::{
    lock, out_of_bounds, send, signal_access, store_with_signal, sync_channel, Access, BatchOptions, Completion,
    ConnStats, Duration, Error, Instant, Mapping, Mutex, NodeId, Notification, Op, OpFlags, PeerMsg, PeerTransport,
    Pinned, PushError, RegionId, Relaxed, RemoteRegion, RingSender, ShmPeer, Signal, SignalOp, Target, KIND_MESSAGE,
    KIND_NOTIFY, NOTIFY_RECORD_BYTES,
};
use crate::owner::apply_atomic;

impl PeerTransport for ShmPeer {
    fn peer(&self) -> NodeId {
        self.peer
    }

    fn kind(&self) -> &'static str {
        "shm"
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Relaxed)
    }

    fn write(&self, t: &RemoteRegion, offset: u64, data: &[u8], flags: OpFlags) -> Op {
        Op::ready(self.do_write(t, offset, data, flags))
    }

    fn write_batch(&self, t: &RemoteRegion, entries: &[(u64, &[u8])], flags: OpFlags, opts: BatchOptions) -> Op {
        Op::ready(self.do_batch(t, entries, flags, opts))
    }

    fn write_signal(&self, t: &RemoteRegion, offset: u64, data: &[u8], signal: Signal, flags: OpFlags) -> Op {
        Op::ready(self.do_write_signal(t, offset, data, signal, flags))
    }

    fn read(&self, t: &RemoteRegion, offset: u64, len: u64, flags: OpFlags) -> Op {
        Op::ready(self.do_read(t, offset, len, flags))
    }

    fn compare_swap(&self, t: &RemoteRegion, offset: u64, expected: u64, new: u64, flags: OpFlags) -> Op {
        Op::ready(self.do_atomic(t, offset, flags, AtomicOp::CompareSwap { expected, new }))
    }

    fn fetch_add(&self, t: &RemoteRegion, offset: u64, add: u64, flags: OpFlags) -> Op {
        Op::ready(self.do_atomic(t, offset, flags, AtomicOp::FetchAdd(add)))
    }

    fn send(&self, msg: &[u8]) -> Op {
        if !self.alive.load(Relaxed) {
            return Op::ready(Err(Error::PeerGone(self.peer)));
        }
        let r = self.push(&self.tx_msg, KIND_MESSAGE, &[msg]).map(|()| Completion::Done);
        Op::ready(r)
    }

    /// Written in place into the peer's ring; `None` when `fill` sent nothing or the ring had
    /// no room for `max` bytes (then `fill` was not called, and the peer's doorbell rang so it
    /// drains). No waiting: a thread that also drains rings of its own must not wait for room
    /// in a peer's.
    fn send_with(&self, max: usize, fill: &mut dyn FnMut(&mut [u8]) -> Option<usize>) -> Option<Op> {
        if !self.alive.load(Relaxed) {
            return Some(Op::ready(Err(Error::PeerGone(self.peer))));
        }
        let r = lock(&self.tx_msg).push_with(KIND_MESSAGE, max as u64, fill);
        match r {
            Ok(Some(_)) => {
                self.bell.ring();
                Some(Op::ready(Ok(Completion::Done)))
            }
            Ok(None) => None,
            Err(PushError::Full) => {
                self.stats.ring_full_waits.fetch_add(1, Relaxed);
                self.bell.ring();
                None
            }
            Err(PushError::TooLarge { len, max }) => {
                Some(Op::ready(Err(Error::MessageTooLarge { len: len as usize, max: max as usize })))
            }
        }
    }

    fn try_recv(&self, out: &mut Vec<u8>) -> Result<bool, Error> {
        self.try_recv_with(&mut |payload| {
            out.clear();
            out.extend_from_slice(payload);
        })
    }

    fn try_recv_with(&self, f: &mut dyn FnMut(&[u8])) -> Result<bool, Error> {
        if !self.rx_msg_watch.pending() {
            return Ok(false);
        }
        match lock(&self.rx_msg).pop_with(|kind, payload| (kind == KIND_MESSAGE).then(|| f(payload)).is_some()) {
            Ok(Some(true)) => Ok(true),
            Ok(Some(false)) => Err(Error::Protocol("unknown record kind in message ring".into())),
            Ok(None) => Ok(false),
            Err(e) => Err(Error::Protocol(e.to_string())),
        }
    }

    fn unread(&self) -> bool {
        self.rx_msg_watch.pending() || self.rx_notify_watch.pending()
    }

    fn try_notification(&self) -> Result<Option<Notification>, Error> {
        if !self.rx_notify_watch.pending() {
            return Ok(None);
        }
        // Read in place from the ring (no buffer per notification).
        let parse = |kind: u32, rec: &[u8]| {
            if kind != KIND_NOTIFY || rec.len() != NOTIFY_RECORD_BYTES {
                return None;
            }
            let u64_at = |i: usize| u64::from_le_bytes(rec[i..i + 8].try_into().expect("8 bytes"));
            Some(Notification {
                from: self.peer,
                region: u32::from_le_bytes(rec[0..4].try_into().expect("4 bytes")),
                offset: u64_at(8),
                len: u64_at(16),
                imm: u64_at(24),
            })
        };
        match lock(&self.rx_notify).pop_with(parse) {
            Ok(Some(Some(n))) => Ok(Some(n)),
            Ok(Some(None)) => Err(Error::Protocol("malformed notification record".into())),
            Ok(None) => Ok(None),
            Err(e) => Err(Error::Protocol(e.to_string())),
        }
    }

    fn pin(&self, t: &RemoteRegion, need: Access) -> Result<Pinned, Error> {
        let (mem, pins, access) = self.with_target(t, need, |place| match place {
            Target::Mapped(m) => Ok((m.mem.clone(), m.pins.clone(), m.access)),
            Target::Served => {
                Err(Error::Config(format!("region {} is served by its owner: it cannot be pinned", t.region)))
            }
        })?;
        let stats = self.stats.clone();
        let counts = Box::new(move |writes, bytes| {
            stats.writes.fetch_add(writes, Relaxed);
            stats.bytes_written.fetch_add(bytes, Relaxed);
        });
        Pinned::new(mem, &pins, t.region, self.peer, access, counts)
    }

    fn unmap(&self, region: RegionId, timeout: Duration) -> bool {
        if !self.alive.load(Relaxed) {
            return false;
        }
        let seq = self.next_req.fetch_add(1, Relaxed);
        let (tx, rx) = sync_channel(1);
        lock(&self.unmap_waiters).insert(seq, tx);
        if send(&self.sock, &PeerMsg::Unmap { region, seq }, &[]).is_err() {
            lock(&self.unmap_waiters).remove(&seq);
            return false;
        }
        let ok = rx.recv_timeout(timeout).is_ok();
        lock(&self.unmap_waiters).remove(&seq);
        ok
    }

    fn cut_off(&self) {
        self.alive.store(false, Relaxed);
        self.sock.shutdown();
    }

    fn stats(&self) -> ConnStats {
        let s = &self.stats;
        ConnStats {
            writes: s.writes.load(Relaxed),
            reads: s.reads.load(Relaxed),
            atomics: s.atomics.load(Relaxed),
            bytes_written: s.bytes_written.load(Relaxed),
            bytes_read: s.bytes_read.load(Relaxed),
            // Counted by the ring under its lock (no atomic instruction per message).
            messages_sent: lock(&self.tx_msg).records,
            notifications_sent: s.notifications_sent.load(Relaxed),
            refused: s.refused.load(Relaxed),
            shm: Some(crate::ShmStats {
                ring_full_waits: s.ring_full_waits.load(Relaxed),
                doorbells: self.bell.rings(),
                mappings: s.mappings.load(Relaxed),
            }),
            edge: None,
        }
    }
}

impl ShmPeer {
    /// Append a record to one of the peer's rings, waiting for room up to the op timeout,
    /// then ring its doorbell (a no-op while it is polling).
    pub(super) fn push(&self, ring: &Mutex<RingSender>, kind: u32, parts: &[&[u8]]) -> Result<(), Error> {
        let mut deadline = None;
        loop {
            let r = lock(ring).push(kind, parts);
            match r {
                Ok(()) => {
                    self.bell.ring();
                    return Ok(());
                }
                Err(PushError::TooLarge { len, max }) => {
                    return Err(Error::MessageTooLarge { len: len as usize, max: max as usize })
                }
                Err(PushError::Full) => {
                    if !self.alive.load(Relaxed) {
                        return Err(Error::PeerGone(self.peer));
                    }
                    self.stats.ring_full_waits.fetch_add(1, Relaxed);
                    let d = *deadline.get_or_insert_with(|| Instant::now() + self.op_timeout);
                    if Instant::now() >= d {
                        return Err(Error::Timeout);
                    }
                    self.bell.ring();
                    std::thread::yield_now();
                }
            }
        }
    }

    pub(super) fn notify_after(&self, region: RegionId, offset: u64, len: u64, flags: OpFlags) -> Result<(), Error> {
        let Some(imm) = flags.notify else {
            return Ok(());
        };
        let mut rec = [0u8; NOTIFY_RECORD_BYTES];
        rec[0..4].copy_from_slice(&region.to_le_bytes());
        rec[8..16].copy_from_slice(&offset.to_le_bytes());
        rec[16..24].copy_from_slice(&len.to_le_bytes());
        rec[24..32].copy_from_slice(&imm.to_le_bytes());
        self.push(&self.tx_notify, KIND_NOTIFY, &[&rec])?;
        self.stats.notifications_sent.fetch_add(1, Relaxed);
        Ok(())
    }

    pub(super) fn oob(t: &RemoteRegion, m: &Mapping, offset: u64, len: u64) -> Error {
        out_of_bounds(t.region, &m.mem, offset, len)
    }

    pub(super) fn refused(&self, e: Error) -> Error {
        self.stats.refused.fetch_add(1, Relaxed);
        e
    }

    pub(super) fn do_write(
        &self,
        t: &RemoteRegion,
        offset: u64,
        data: &[u8],
        flags: OpFlags,
    ) -> Result<Completion, Error> {
        let len = data.len() as u64;
        self.with_target(t, Access::WRITE, |place| {
            let m = match place {
                Target::Mapped(m) => m,
                Target::Served => {
                    self.served_write(t, offset, data)?;
                    self.stats.writes.fetch_add(1, Relaxed);
                    self.stats.bytes_written.fetch_add(len, Relaxed);
                    return Ok(());
                }
            };
            if offset.checked_add(len).is_none_or(|end| end > m.mem.len() as u64) {
                return Err(self.refused(Self::oob(t, m, offset, len)));
            }
            // Counted before the stores: an atomic instruction after them would wait for
            // them to reach the peer's cache, and this call need not.
            self.stats.writes.fetch_add(1, Relaxed);
            self.stats.bytes_written.fetch_add(len, Relaxed);
            if m.mem.write_at(offset, data) {
                Ok(())
            } else {
                Err(self.refused(Self::oob(t, m, offset, len)))
            }
        })?;
        self.notify_after(t.region, offset, len, flags)?;
        Ok(Completion::Done)
    }

    pub(super) fn do_write_signal(
        &self,
        t: &RemoteRegion,
        offset: u64,
        data: &[u8],
        signal: Signal,
        flags: OpFlags,
    ) -> Result<Completion, Error> {
        let old = self.with_target(t, signal_access(&signal, data), |place| {
            let m = match place {
                Target::Mapped(m) => m,
                Target::Served => {
                    let old = self.served_write_signal(t, offset, data, signal)?;
                    self.stats.writes.fetch_add(1, Relaxed);
                    self.stats.bytes_written.fetch_add(data.len() as u64, Relaxed);
                    return Ok(old);
                }
            };
            // Counted before the stores: an atomic instruction after them would wait for
            // them to reach the peer's cache, and this call need not.
            self.stats.writes.fetch_add(1, Relaxed);
            self.stats.bytes_written.fetch_add(data.len() as u64, Relaxed);
            store_with_signal(t.region, &m.mem, offset, data, signal).map_err(|e| self.refused(e))
        })?;
        self.notify_after(t.region, signal.offset, 8, flags)?;
        Ok(match signal.op {
            SignalOp::Set(_) => Completion::Done,
            SignalOp::Add(_) => Completion::Value(old),
        })
    }

    pub(super) fn do_batch(
        &self,
        t: &RemoteRegion,
        entries: &[(u64, &[u8])],
        flags: OpFlags,
        opts: BatchOptions,
    ) -> Result<Completion, Error> {
        let f = self.fabric.upgrade().ok_or(Error::Closed)?;
        self.with_target(t, Access::WRITE, |place| {
            let Target::Mapped(m) = place else {
                return self.served_batch(t, entries);
            };
            f.copy.write_batch(&m.mem, entries, opts.combine, opts.channels).map(drop).map_err(|i| {
                let (off, d) = entries[i];
                self.refused(Self::oob(t, m, off, d.len() as u64))
            })
        })?;
        let total: u64 = entries.iter().map(|(_, d)| d.len() as u64).sum();
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats.bytes_written.fetch_add(total, Relaxed);
        let (last_off, last) = entries.last().map_or((0, 0), |(o, d)| (*o, d.len() as u64));
        self.notify_after(t.region, last_off, last, flags)?;
        Ok(Completion::Done)
    }

    pub(super) fn do_read(&self, t: &RemoteRegion, offset: u64, len: u64, flags: OpFlags) -> Result<Completion, Error> {
        let out = self.with_target(t, Access::READ, |place| {
            let Target::Mapped(m) = place else {
                return self.served_read(t, offset, len);
            };
            if offset.checked_add(len).is_none_or(|end| end > m.mem.len() as u64) {
                return Err(self.refused(Self::oob(t, m, offset, len)));
            }
            let mut out = vec![0u8; len as usize];
            m.mem.read_at(offset, &mut out);
            Ok(out)
        })?;
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.bytes_read.fetch_add(len, Relaxed);
        self.notify_after(t.region, offset, len, flags)?;
        Ok(Completion::Data(out))
    }

    pub(super) fn do_atomic(
        &self,
        t: &RemoteRegion,
        offset: u64,
        flags: OpFlags,
        op: AtomicOp,
    ) -> Result<Completion, Error> {
        if !offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset });
        }
        let old = self.with_target(t, Access::ATOMIC, |place| match place {
            Target::Served => self.served_atomic(t, offset, op),
            Target::Mapped(m) => match m.mem.atomic_u64(offset) {
                Some(word) => Ok(apply_atomic(word, op)),
                None => Err(self.refused(Self::oob(t, m, offset, 8))),
            },
        })?;
        self.stats.atomics.fetch_add(1, Relaxed);
        self.notify_after(t.region, offset, 8, flags)?;
        Ok(Completion::Value(old))
    }
}
