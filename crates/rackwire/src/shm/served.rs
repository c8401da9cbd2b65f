//! Served regions over shared memory ([`crate::Fabric::alloc_served`]): the owner never hands
//! the memory over, so each operation goes to it as a request on the control socket (its
//! data after the message, in pieces of at most [`PAYLOAD_BYTES_MAX`]), and the owner's
//! connection thread checks it against the grant and carries it out ([`crate::owner`]).
//! A peer keeps at most [`SERVED_WINDOW`] pieces of one operation in flight.

use std::collections::VecDeque;
use std::sync::mpsc::Receiver;

use rackwire_proto::AtomicOp;

use super::control::{send_with, ServedOp, PAYLOAD_BYTES_MAX};
use super::{
    lock, signal_access, sync_channel, warn, Access, Error, Instant, Node, PeerMsg, PeerTransport, RecvTimeoutError,
    Refusal, RefusedOp, RegionId, Relaxed, RemoteRegion, ShmPeer, Signal, SignalOp,
};
use crate::owner;

/// Pieces of one operation on a served region in flight at once.
pub(super) const SERVED_WINDOW: usize = 8;

/// The owner's answer to one piece.
pub(super) struct ServedReply {
    pub(super) code: u8,
    pub(super) detail: u64,
    pub(super) value: u64,
    pub(super) data: Vec<u8>,
}

/// One piece of an operation: what to do, and the data to send with it.
type Piece<'a> = (ServedOp, Option<&'a [u8]>);

impl ShmPeer {
    /// Initiator: have the owner carry out `pieces` in order; `done` gets each answer (its
    /// index, the atomic's old value, a read's data). After a refusal nothing more is sent;
    /// the pieces in flight are still waited for.
    fn ask_owner(
        &self,
        t: &RemoteRegion,
        op: &RefusedOp,
        pieces: &[Piece<'_>],
        mut done: impl FnMut(usize, u64, &[u8]) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + self.op_timeout;
        let key = t.key_hex();
        let mut in_flight: VecDeque<(usize, u64, Receiver<ServedReply>)> = VecDeque::new();
        let (mut next, mut result) = (0, Ok(()));
        loop {
            if result.is_ok() && next < pieces.len() && in_flight.len() < SERVED_WINDOW {
                let (what, data) = pieces[next];
                let req = self.next_req.fetch_add(1, Relaxed);
                let (tx, rx) = sync_channel(1);
                lock(&self.served_waiters).insert(req, tx);
                let msg = PeerMsg::Served { req, region: t.region, key: key.clone(), op: what };
                if send_with(&self.sock, &msg, data, &[]).is_err() {
                    lock(&self.served_waiters).remove(&req);
                    result = Err(Error::PeerGone(self.peer));
                } else {
                    in_flight.push_back((next, req, rx));
                    next += 1;
                }
                continue;
            }
            let Some((i, req, rx)) = in_flight.pop_front() else {
                return result;
            };
            let answer = match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(r) if r.code == 0 => done(i, r.value, &r.data),
                Ok(r) => Err(self.refused(Error::refused(Refusal::from_wire(r.code, r.detail), op))),
                Err(RecvTimeoutError::Timeout) => {
                    lock(&self.served_waiters).remove(&req);
                    Err(Error::Timeout)
                }
                Err(RecvTimeoutError::Disconnected) => Err(Error::PeerGone(self.peer)),
            };
            if result.is_ok() {
                result = answer;
            }
        }
    }

    /// `offset..offset + len` lies in the region as its handle gives its length (the owner
    /// checks again against the region itself).
    fn within(&self, t: &RemoteRegion, offset: u64, len: u64) -> Result<(), Error> {
        match offset.checked_add(len) {
            Some(end) if end <= t.len => Ok(()),
            _ => Err(self.refused(Error::OutOfBounds { region: t.region, offset, len, region_len: t.len })),
        }
    }

    fn refusing(&self, t: &RemoteRegion, offset: u64, len: u64, need: Access) -> RefusedOp {
        RefusedOp { node: self.peer, region: t.region, offset, len, need }
    }

    /// The write pieces of `data` at `offset` (one, empty, for no data: the owner still checks).
    fn write_pieces<'a>(offset: u64, data: &'a [u8], out: &mut Vec<Piece<'a>>) {
        let len = data.len() as u64;
        let mut at = offset;
        for chunk in data.chunks(PAYLOAD_BYTES_MAX) {
            out.push((ServedOp::Write { offset, len, at }, Some(chunk)));
            at += chunk.len() as u64;
        }
        if data.is_empty() {
            out.push((ServedOp::Write { offset, len, at }, Some(&[])));
        }
    }

    pub(super) fn served_write(&self, t: &RemoteRegion, offset: u64, data: &[u8]) -> Result<(), Error> {
        let len = data.len() as u64;
        self.within(t, offset, len)?;
        let mut pieces = Vec::new();
        Self::write_pieces(offset, data, &mut pieces);
        self.ask_owner(t, &self.refusing(t, offset, len, Access::WRITE), &pieces, |_, _, _| Ok(()))
    }

    /// Every entry is checked against the handle's length before any is sent.
    pub(super) fn served_batch(&self, t: &RemoteRegion, entries: &[(u64, &[u8])]) -> Result<(), Error> {
        let mut pieces = Vec::new();
        for &(offset, data) in entries {
            self.within(t, offset, data.len() as u64)?;
            Self::write_pieces(offset, data, &mut pieces);
        }
        let (first, _) = entries.first().copied().unwrap_or((0, &[]));
        self.ask_owner(t, &self.refusing(t, first, 0, Access::WRITE), &pieces, |_, _, _| Ok(()))
    }

    /// The data in pieces, the last of them carrying the signal; the old value of the word.
    pub(super) fn served_write_signal(
        &self,
        t: &RemoteRegion,
        offset: u64,
        data: &[u8],
        signal: Signal,
    ) -> Result<u64, Error> {
        if !signal.offset.is_multiple_of(8) {
            return Err(Error::Misaligned { offset: signal.offset });
        }
        self.within(t, signal.offset, 8)?;
        self.within(t, offset, data.len() as u64)?;
        let (add, value) = match signal.op {
            SignalOp::Set(v) => (false, v),
            SignalOp::Add(v) => (true, v),
        };
        let mut pieces = Vec::new();
        Self::write_pieces(offset, data, &mut pieces);
        let last = pieces.pop().expect("at least one piece");
        let (ServedOp::Write { at, .. }, chunk) = last else { unreachable!("write pieces are writes") };
        pieces.push((ServedOp::WriteSignal { offset: at, signal: signal.offset, add, value }, chunk));
        let n = pieces.len();
        let mut old = 0;
        let op = self.refusing(t, offset, data.len() as u64, signal_access(&signal, data));
        self.ask_owner(t, &op, &pieces, |i, v, _| {
            if i + 1 == n {
                old = v;
            }
            Ok(())
        })?;
        Ok(old)
    }

    pub(super) fn served_read(&self, t: &RemoteRegion, offset: u64, len: u64) -> Result<Vec<u8>, Error> {
        self.within(t, offset, len)?;
        let mut out = vec![0u8; len as usize];
        let pieces: Vec<Piece<'_>> = (0..len)
            .step_by(PAYLOAD_BYTES_MAX)
            .map(|at| (ServedOp::Read { offset: offset + at, len: (len - at).min(PAYLOAD_BYTES_MAX as u64) }, None))
            .collect();
        let pieces = if pieces.is_empty() { vec![(ServedOp::Read { offset, len: 0 }, None)] } else { pieces };
        self.ask_owner(t, &self.refusing(t, offset, len, Access::READ), &pieces, |i, _, data| {
            let at = i * PAYLOAD_BYTES_MAX;
            let want = (len as usize - at.min(len as usize)).min(PAYLOAD_BYTES_MAX);
            if data.len() != want {
                return Err(Error::Protocol(format!("owner sent {} bytes for a read of {want}", data.len())));
            }
            out[at..at + want].copy_from_slice(data);
            Ok(())
        })?;
        Ok(out)
    }

    pub(super) fn served_atomic(&self, t: &RemoteRegion, offset: u64, op: AtomicOp) -> Result<u64, Error> {
        let what = match op {
            AtomicOp::CompareSwap { expected, new } => ServedOp::CompareSwap { offset, expected, new },
            AtomicOp::FetchAdd(add) => ServedOp::FetchAdd { offset, add },
        };
        let mut old = 0;
        self.ask_owner(t, &self.refusing(t, offset, 8, Access::ATOMIC), &[(what, None)], |_, v, _| {
            old = v;
            Ok(())
        })?;
        Ok(old)
    }

    /// Initiator: the owner's answer to piece `req`, with the data after it.
    pub(super) fn served_done(&self, req: u64, code: u8, detail: u64, value: u64, data: &[u8]) {
        if let Some(w) = lock(&self.served_waiters).remove(&req) {
            let _ = w.send(ServedReply { code, detail, value, data: data.to_vec() });
        }
    }

    /// Owner: check and carry out one piece asked by the peer, and answer it.
    pub(super) fn serve_op(&self, req: u64, region: RegionId, key: &str, op: ServedOp, data: &[u8]) {
        let Some(f) = self.fabric.upgrade() else {
            return;
        };
        let mut read_buf = Vec::new();
        let done = match u128::from_str_radix(key, 16).ok().filter(|_| key.len() == 32) {
            None => {
                f.regions.refused(self.peer, region, Refusal::BadKey);
                Err(Refusal::BadKey)
            }
            Some(key) => self.carry_out(&f, region, key, op, data, &mut read_buf),
        };
        let (code, detail, value) = match done {
            Ok(v) => (0, 0, v),
            Err(why) => {
                self.stats.refused.fetch_add(1, Relaxed);
                (why.code(), why.detail(), 0)
            }
        };
        let reply = PeerMsg::ServedDone { req, code, detail, value };
        let payload = matches!(op, ServedOp::Read { .. }).then_some(read_buf.as_slice());
        if let Err(e) = send_with(&self.sock, &reply, payload, &[]) {
            // A peer that reads nothing for the send timeout holds this node up no more.
            warn!(peer = self.peer, region, "could not answer a served operation ({e}); cutting the peer off");
            self.cut_off();
        }
    }

    fn carry_out(
        &self,
        f: &Node,
        region: RegionId,
        key: u128,
        op: ServedOp,
        data: &[u8],
        read_buf: &mut Vec<u8>,
    ) -> Result<u64, Refusal> {
        let peer = self.peer;
        match op {
            ServedOp::Write { offset, len, at } => {
                owner::write(f, peer, region, key, offset, len, at, data).map(|()| 0)
            }
            ServedOp::WriteSignal { offset, signal, add, value } => {
                let op = if add { SignalOp::Add(value) } else { SignalOp::Set(value) };
                owner::write_signal(f, peer, region, key, offset, data, Signal { offset: signal, op })
            }
            ServedOp::Read { offset, len } => {
                // The length is the peer's: one answer carries at most one piece.
                if len > PAYLOAD_BYTES_MAX as u64 {
                    f.regions.refused(peer, region, Refusal::TooLarge);
                    return Err(Refusal::TooLarge);
                }
                read_buf.resize(len as usize, 0);
                owner::read(f, peer, region, key, offset, read_buf).map(|()| 0)
            }
            ServedOp::CompareSwap { offset, expected, new } => {
                owner::atomic(f, peer, region, key, offset, AtomicOp::CompareSwap { expected, new })
            }
            ServedOp::FetchAdd { offset, add } => owner::atomic(f, peer, region, key, offset, AtomicOp::FetchAdd(add)),
        }
    }
}
