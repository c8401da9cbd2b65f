//! RMA and atomics onto memory the application registered. The target's provider does each
//! access for the initiator, after checking, in order: that the initiator is in the address
//! vector of the endpoint it names (a region is open to the peers an application put in its
//! vector, nobody else: `FI_EACCES`), that the key names a registered region
//! (`FI_EKEYREJECTED`), that the region allows the access (`FI_REMOTE_WRITE`, `FI_REMOTE_READ`)
//! and that the whole range lies inside it (`FI_EACCES`). Addresses are virtual addresses
//! (`FI_MR_VIRT_ADDR`), keys the provider's (`FI_MR_PROV_KEY`): random 64-bit numbers.
//! A write or an atomic completes at the initiator when the target's answer arrives; a read
//! when its last piece of data does.

use std::collections::HashMap;

use rackwire::NodeId;

use crate::atomics::{self, Form};
use crate::consts::*;
use crate::engine::{with, State};
use crate::queues::{Addr, Entry, ProvErr, TxDone};
use crate::regions::{Mr, RmaOp, Waiting, MRS_MAX, RMA_IN_FLIGHT_MAX};
use crate::tx::{Source, TxOp};
use crate::user::{capacity, scatter, Iov, Iovs, Registered};
use crate::wire::{Header, Kind};

/// An atomic request's operation, datatype, element count and form, in a header's `data`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicReq {
    /// `enum fi_op`.
    pub op: i32,
    /// `enum fi_datatype`.
    pub dt: i32,
    /// Elements.
    pub count: u32,
    /// Which call.
    pub form: Form,
}

impl AtomicReq {
    /// Into a header's `data`.
    pub fn encode(&self) -> u64 {
        u64::from(self.op as u8)
            | u64::from(self.dt as u8) << 8
            | u64::from(self.form.code()) << 16
            | u64::from(self.count) << 32
    }

    /// From a header's `data`, if it names a valid operation.
    pub fn decode(v: u64) -> Option<AtomicReq> {
        let req = AtomicReq {
            op: i32::from(v as u8),
            dt: i32::from((v >> 8) as u8),
            form: Form::from_code((v >> 16) as u8)?,
            count: (v >> 32) as u32,
        };
        (atomics::valid(req.dt, req.op, req.form) && req.count as usize <= atomics::count_max(req.dt)).then_some(req)
    }
}

/// A fresh key: random, never 0, not in use.
fn new_key(mrs: &HashMap<u64, Mr>) -> Result<u64, i32> {
    for _ in 0..16 {
        let mut b = [0u8; 8];
        getrandom::fill(&mut b).map_err(|_| FI_EOTHER)?;
        let k = u64::from_le_bytes(b);
        if k != 0 && !mrs.contains_key(&k) {
            return Ok(k);
        }
    }
    Err(FI_EOTHER)
}

impl State {
    /// Register `mem` for `access`; its key.
    pub(crate) fn mr_reg(&mut self, mem: Registered, access: u64) -> Result<u64, i32> {
        if self.mrs.len() >= MRS_MAX {
            return Err(FI_ENOMEM);
        }
        let key = new_key(&self.mrs)?;
        self.mrs.insert(key, Mr { mem, access });
        Ok(key)
    }

    /// Close region `key`: read answers still reading it take a copy of what they have left
    /// to send first (the application may free the memory once the call returns).
    pub(crate) fn mr_close(&mut self, key: u64) -> Result<(), i32> {
        self.mrs.remove(&key).ok_or(FI_EINVAL)?;
        for e in self.eps.values_mut() {
            for op in e.txq.iter_mut() {
                if let Source::Region { mem, key: k, at } = op.src {
                    if k == key {
                        let mut bytes = vec![0; op.total - op.sent];
                        mem.copy_out(at + op.sent as u64, &mut bytes);
                        op.src = Source::Tail { bytes, from: op.sent };
                    }
                }
            }
        }
        Ok(())
    }

    /// The region `key` names, if `initiator` may make an access needing `need` of `n` bytes
    /// at `addr` through endpoint `ep`.
    fn allowed(&self, ep: u32, initiator: Addr, key: u64, addr: u64, n: usize, need: u64) -> Result<Mr, i32> {
        let e = self.eps.get(&ep).ok_or(FI_EACCES)?;
        let known = e.av.and_then(|a| self.avs.get(&a)).is_some_and(|av| av.lookup(initiator).is_some());
        if !known {
            return Err(FI_EACCES);
        }
        let mr = *self.mrs.get(&key).ok_or(FI_EKEYREJECTED)?;
        if mr.access & need != need || !mr.mem.holds(addr, n) {
            return Err(FI_EACCES);
        }
        Ok(mr)
    }

    /// Queue an answer from endpoint `ep` to `to`.
    fn answer(&mut self, ep: u32, to: Addr, kind: Kind, op: u64, data: u64, bytes: Vec<u8>) {
        let total = bytes.len();
        self.answer_from(ep, to, kind, op, data, Source::Owned(bytes), total);
    }

    /// Queue an answer whose `total` bytes are in `src`.
    #[allow(clippy::too_many_arguments)]
    fn answer_from(&mut self, ep: u32, to: Addr, kind: Kind, op: u64, data: u64, src: Source, total: usize) {
        let header = Header {
            kind,
            tagged: false,
            has_data: false,
            dst_ep: to.1,
            src_ep: ep,
            tag: 0,
            data,
            msg_id: op,
            len_or_offset: 0,
            last: false,
        };
        if self.eps.contains_key(&ep) {
            *self.answers.entry(to.0).or_default() += 1;
        }
        self.queue(ep, TxOp { dest: to, header, src, total, sent: 0, done: None });
    }

    /// Target: carry out (or refuse) an RMA request from `from`.
    pub(crate) fn serve_rma(&mut self, from: NodeId, h: &Header, payload: &[u8]) {
        let (ep, initiator) = (h.dst_ep, (from, h.src_ep));
        match h.kind {
            Kind::Write => {
                let r = self.allowed(ep, initiator, h.tag, h.len_or_offset, payload.len(), FI_REMOTE_WRITE);
                match r {
                    Ok(mr) => mr.mem.with_mut(h.len_or_offset, payload.len(), |m| m.copy_from_slice(payload)),
                    Err(e) => return self.answer(ep, initiator, Kind::Ack, h.msg_id, e as u64, Vec::new()),
                }
                if h.last {
                    if h.has_data {
                        self.remote_data(ep, initiator, h.data);
                    }
                    self.answer(ep, initiator, Kind::Ack, h.msg_id, 0, Vec::new());
                }
            }
            Kind::ReadReq => {
                let n = usize::try_from(h.data).unwrap_or(usize::MAX);
                match self.allowed(ep, initiator, h.tag, h.len_or_offset, n, FI_REMOTE_READ) {
                    Ok(mr) => {
                        let src = Source::Region { mem: mr.mem, key: h.tag, at: h.len_or_offset };
                        self.answer_from(ep, initiator, Kind::ReadResp, h.msg_id, 0, src, n);
                    }
                    Err(e) => self.answer(ep, initiator, Kind::Ack, h.msg_id, e as u64, Vec::new()),
                }
            }
            Kind::Atomic => {
                let result = AtomicReq::decode(h.data).ok_or(FI_EINVAL).and_then(|req| {
                    let size = atomics::elem_bytes(req.dt).ok_or(FI_EINVAL)?;
                    let n = size * req.count as usize;
                    let compares = if req.form == Form::Compare { n } else { 0 };
                    if payload.len() != n + compares {
                        return Err(FI_EINVAL);
                    }
                    let need = FI_REMOTE_WRITE | if req.form == Form::Write { 0 } else { FI_REMOTE_READ };
                    let mr = self.allowed(ep, initiator, h.tag, h.len_or_offset, n, need)?;
                    let old = mr.mem.with_mut(h.len_or_offset, n, |t| {
                        atomics::run(req.dt, req.op, t, &payload[..n], &payload[n..])
                    });
                    Ok(if req.form == Form::Write { Vec::new() } else { old })
                });
                match result {
                    Ok(old) => self.answer(ep, initiator, Kind::Ack, h.msg_id, 0, old),
                    Err(e) => self.answer(ep, initiator, Kind::Ack, h.msg_id, e as u64, Vec::new()),
                }
            }
            _ => {}
        }
    }

    /// A write with remote CQ data landed: the target endpoint's receive queue says so.
    fn remote_data(&mut self, ep: u32, from: Addr, data: u64) {
        let src = self.src_addr(ep, from);
        let Some(cq) = self.eps.get(&ep).and_then(|e| e.rx_cq).and_then(|(c, _)| self.cqs.get_mut(&c)) else { return };
        let flags = FI_REMOTE_WRITE | FI_RMA | FI_REMOTE_CQ_DATA;
        cq.entries.push_back(Entry { flags, data, src, ..Entry::default() });
    }

    /// Initiator: the target's answer (or a piece of a read's data) for operation `h.msg_id`.
    pub(crate) fn rma_answer(&mut self, from: NodeId, h: &Header, payload: &[u8]) {
        let Some(op) = self.rma.get_mut(&h.msg_id) else { return };
        // Only the target it was sent to answers an operation.
        if op.dest != (from, h.src_ep) {
            self.dropped += 1;
            return;
        }
        let finished = match (&mut op.waiting, h.kind) {
            (_, Kind::Ack) if h.data != 0 => Some(Err(i32::try_from(h.data).unwrap_or(FI_EIO))),
            (Waiting::Ack, Kind::Ack) => Some(Ok(())),
            (Waiting::Old { into }, Kind::Ack) => {
                scatter(into, 0, payload);
                Some(Ok(()))
            }
            (Waiting::Read { into, got }, Kind::ReadResp) => {
                scatter(into, *got, payload);
                *got += payload.len();
                h.last.then_some(Ok(()))
            }
            _ => None,
        };
        let Some(result) = finished else { return };
        let op = self.rma.remove(&h.msg_id).expect("looked up");
        let cntr = self.eps.get(&op.ep).and_then(|e| if op.counts_as == FI_READ { e.rd_cntr } else { e.wr_cntr });
        self.count(cntr, result.is_ok());
        match result {
            Ok(()) => self.tx_entry(op.done, None),
            Err(e) => self.tx_entry(op.done, Some((e, ProvErr::Refused))),
        }
    }

    /// Initiator: start an RMA operation from `ep` to `to`: a write of `src` (`total` bytes)
    /// to `addr` under `key`, a read of `total` bytes into `into`, or an atomic.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rma_start(
        &mut self,
        ep: u32,
        to: Addr,
        header: Header,
        src: Source,
        total: usize,
        done: TxDone,
        waiting: Waiting,
        counts_as: u64,
    ) -> Result<(), i32> {
        if self.rma.len() >= RMA_IN_FLIGHT_MAX {
            return Err(FI_EAGAIN);
        }
        let id = header.msg_id;
        self.rma.insert(id, RmaOp { ep, dest: to, done, waiting, counts_as });
        self.queue(ep, TxOp { dest: to, header, src, total, sent: 0, done: None });
        Ok(())
    }

    /// Operations of endpoint `ep` in flight end with an error (it is closing).
    pub(crate) fn rma_drop_ep(&mut self, ep: u32) {
        self.rma.retain(|_, op| op.ep != ep);
    }
}

// ---- what the C side calls ----

/// Register `len` bytes at `base` for `access`; the key.
pub fn mr_reg(base: usize, len: usize, access: u64) -> Result<u64, i32> {
    if base.checked_add(len).is_none() {
        return Err(FI_EINVAL);
    }
    with(|_, st| st.mr_reg(Registered { base, len }, access))
}

/// Close the region of `key`: no peer reaches it any more.
pub fn mr_close(key: u64) -> Result<(), i32> {
    with(|_, st| st.mr_close(key))
}

/// The header of a request from `ep` to `to` on `(key, address)`, carrying `data`.
fn request(st: &mut State, kind: Kind, ep: u32, to: Addr, (key, addr): (u64, u64), data: u64) -> Header {
    st.next_msg += 1;
    Header {
        kind,
        tagged: false,
        has_data: false,
        dst_ep: to.1,
        src_ep: ep,
        tag: key,
        data,
        msg_id: st.next_msg,
        len_or_offset: addr,
        last: false,
    }
}

/// An RMA write of `iov` from `ep` to `addr` of the region `key` at `dest`, with remote CQ
/// `data` or none.
#[allow(clippy::too_many_arguments)]
pub fn write(
    ep: u32,
    iov: &[Iov],
    dest: u64,
    addr: u64,
    key: u64,
    data: Option<u64>,
    flags: u64,
    ctx: usize,
) -> Result<(), i32> {
    with(|p, st| {
        let (to, completion) = st.prepare_tx(ep, dest, flags)?;
        let total = capacity(iov);
        let done = TxDone { ep, ctx, flags: FI_RMA | FI_WRITE, len: total, completion };
        let h = Header { has_data: data.is_some(), ..request(st, Kind::Write, ep, to, (key, addr), data.unwrap_or(0)) };
        st.rma_start(ep, to, h, Source::of(iov, flags), total, done, Waiting::Ack, FI_WRITE)?;
        p.push(st, ep);
        Ok(())
    })
}

/// An RMA read into `iov` on `ep` from `addr` of the region `key` at `src`.
pub fn read(ep: u32, iov: Iovs, src: u64, addr: u64, key: u64, flags: u64, ctx: usize) -> Result<(), i32> {
    with(|p, st| {
        let (to, completion) = st.prepare_tx(ep, src, flags)?;
        let total = capacity(&iov);
        let done = TxDone { ep, ctx, flags: FI_RMA | FI_READ, len: total, completion };
        let h = request(st, Kind::ReadReq, ep, to, (key, addr), total as u64);
        st.rma_start(ep, to, h, Source::Owned(Vec::new()), 0, done, Waiting::Read { into: iov, got: 0 }, FI_READ)?;
        p.push(st, ep);
        Ok(())
    })
}

/// What an atomic call names.
#[derive(Debug)]
pub struct AtomicCall<'a> {
    /// Which call.
    pub form: Form,
    /// `enum fi_datatype`.
    pub dt: i32,
    /// `enum fi_op`.
    pub op: i32,
    /// Elements.
    pub count: usize,
    /// The operands (`count` elements; empty for a read).
    pub operands: &'a [u8],
    /// The compare values (the compare form).
    pub compares: &'a [u8],
    /// Where the old values go (fetch and compare forms).
    pub result: Iovs,
}

/// An atomic from `ep` on `addr` of the region `key` at `dest`.
pub fn atomic(
    ep: u32,
    call: AtomicCall<'_>,
    dest: u64,
    addr: u64,
    key: u64,
    flags: u64,
    ctx: usize,
) -> Result<(), i32> {
    if !atomics::valid(call.dt, call.op, call.form) {
        return Err(FI_EOPNOTSUPP);
    }
    let size = atomics::elem_bytes(call.dt).ok_or(FI_EOPNOTSUPP)?;
    let n = size * call.count;
    let compares = if call.form == Form::Compare { n } else { 0 };
    if call.count == 0 || call.count > atomics::count_max(call.dt) || call.compares.len() != compares {
        return Err(FI_EINVAL);
    }
    if call.form != Form::Write && capacity(&call.result) < n {
        return Err(FI_EINVAL);
    }
    let mut payload = vec![0u8; n + compares];
    let have = call.operands.len().min(n);
    payload[..have].copy_from_slice(&call.operands[..have]);
    payload[n..].copy_from_slice(call.compares);
    let req = AtomicReq { op: call.op, dt: call.dt, count: call.count as u32, form: call.form };
    with(|p, st| {
        let (to, completion) = st.prepare_tx(ep, dest, flags)?;
        let (counts_as, waiting) = match call.form {
            Form::Write => (FI_WRITE, Waiting::Ack),
            _ => (FI_READ, Waiting::Old { into: call.result }),
        };
        let done = TxDone { ep, ctx, flags: FI_ATOMIC | counts_as, len: n, completion };
        let h = request(st, Kind::Atomic, ep, to, (key, addr), req.encode());
        let total = payload.len();
        st.rma_start(ep, to, h, Source::Owned(payload), total, done, waiting, counts_as)?;
        p.push(st, ep);
        Ok(())
    })
}

/// How many elements of `dt` one `op` in `form` may carry (`fi_atomicvalid`), or
/// `FI_EOPNOTSUPP`.
pub fn atomic_valid(dt: i32, op: i32, form: Form) -> Result<usize, i32> {
    if atomics::valid(dt, op, form) {
        Ok(atomics::count_max(dt))
    } else {
        Err(FI_EOPNOTSUPP)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks an atomic request's packing both ways, and that a request naming an operation
    // the provider does not do in that form, or too many elements, does not decode (the
    // target refuses it rather than guess).
    #[test]
    fn atomic_requests_pack_and_invalid_ones_are_refused() {
        let req = AtomicReq { op: atomics::op::CSWAP, dt: 7, count: 3, form: Form::Compare };
        assert_eq!(AtomicReq::decode(req.encode()), Some(req));
        let bad = AtomicReq { op: atomics::op::CSWAP, dt: 7, count: 3, form: Form::Write };
        assert_eq!(AtomicReq::decode(bad.encode()), None);
        let many = AtomicReq { op: atomics::op::SUM, dt: 7, count: 1 << 20, form: Form::Write };
        assert_eq!(AtomicReq::decode(many.encode()), None);
    }
}

#[cfg(test)]
mod answers {
    use super::*;
    use crate::engine::{Ep, ANSWERS_QUEUED_MAX};
    use crate::queues::Av;

    /// A state with one enabled endpoint whose vector names node 7's endpoint 0, and a
    /// readable region over `mem`: the endpoint's number and the region's key.
    fn target(mem: &mut [u8]) -> (State, u32, u64) {
        let mut st = State::default();
        let mut av = Av::new(FI_AV_TABLE);
        av.insert((7, 0)).unwrap();
        st.avs.insert(1, av);
        let ep = st.add_ep(Ep { enabled: true, av: Some(1), ..Ep::default() });
        let reg = Registered { base: mem.as_mut_ptr() as usize, len: mem.len() };
        let key = st.mr_reg(reg, FI_REMOTE_READ).unwrap();
        (st, ep, key)
    }

    fn read_req(ep: u32, key: u64, addr: u64, n: u64, id: u64) -> Header {
        Header {
            kind: Kind::ReadReq,
            tagged: false,
            has_data: false,
            dst_ep: ep,
            src_ep: 0,
            tag: key,
            data: n,
            msg_id: id,
            len_or_offset: addr,
            last: false,
        }
    }

    // Checks that a read is answered from the region itself, not a copy: the queued answer
    // reads the region's bytes as its pieces go (a byte changed after the request is the byte
    // sent); that closing the region first leaves the answer the bytes it had left (a copy,
    // sent unchanged after the memory is reused); and that a node's queued answers are counted
    // up to ANSWERS_QUEUED_MAX, past which it is marked to wait, and uncounted as they leave.
    #[test]
    fn read_answers_are_bounded_and_copy_nothing_until_their_region_closes() {
        let mut mem = vec![0u8; 1 << 20];
        let (mut st, ep, key) = target(&mut mem);
        let base = mem.as_ptr() as u64;
        st.serve_rma(7, &read_req(ep, key, base + 100, 3 << 18, 1), &[]);
        let op = st.eps[&ep].txq.back().unwrap();
        assert!(matches!(op.src, Source::Region { .. }), "answered from the region: {:?}", op.src);
        assert_eq!(op.total, 3 << 18);
        mem[100] = 0xab;
        let (h, n) = op.next_piece();
        let mut buf = vec![0u8; crate::wire::HEADER_BYTES + n];
        op.fill(&h, n, &mut buf);
        assert_eq!(buf[crate::wire::HEADER_BYTES], 0xab, "the byte in the region when the piece goes");

        st.eps.get_mut(&ep).unwrap().txq.back_mut().unwrap().sent = 10;
        mem[110] = 0xcd;
        st.mr_close(key).unwrap();
        mem[110] = 0;
        let op = st.eps[&ep].txq.back().unwrap();
        assert!(matches!(op.src, Source::Tail { from: 10, .. }), "{:?}", op.src);
        let (h, n) = op.next_piece();
        let mut buf = vec![0u8; crate::wire::HEADER_BYTES + n];
        op.fill(&h, n, &mut buf);
        assert_eq!(buf[crate::wire::HEADER_BYTES], 0xcd, "the bytes as they were when the region closed");

        // Each request's answer counts against its node until it leaves the queue.
        let (mut st, ep, key) = target(&mut mem);
        for id in 0..ANSWERS_QUEUED_MAX as u64 {
            assert!(!st.answers_full(7));
            st.serve_rma(7, &read_req(ep, key, base, 8, id), &[]);
        }
        assert!(st.answers_full(7), "node 7 now waits");
        let op = st.eps.get_mut(&ep).unwrap().txq.pop_front().unwrap();
        st.answer_gone(&op);
        assert!(!st.answers_full(7), "one answer went: node 7 may ask again");
        st.remove_ep(ep);
        assert!(st.answers.is_empty(), "an endpoint closed takes its answers' counts with it");
    }
}
