//! The calls on endpoints (what the C side's `fid_ep` operations come to): opening, binding,
//! enabling and closing them, naming them, posting sends and receives, cancelling.

use crate::consts::*;
use crate::engine::{with, with_state, Ep, Now, EPS_MAX, MIN_MULTI_RECV_DEFAULT, TX_QUEUE_MAX};
use crate::ep::Posted;
use crate::queues::{Addr, Entry, ErrEntry, ProvErr, TxDone};
use crate::tx::{Source, TxOp};
use crate::user::{capacity, Iov, Iovs};
use crate::wire::{Header, Kind, FRAGMENT_BYTES_MAX};

/// An endpoint; its number.
pub fn ep_open() -> Result<u32, i32> {
    with(|_, st| {
        if st.eps.len() >= EPS_MAX {
            return Err(FI_ENOMEM);
        }
        Ok(st.add_ep(Ep { min_multi_recv: MIN_MULTI_RECV_DEFAULT, ..Ep::default() }))
    })
}

/// Close endpoint `ep`: its queued sends and posted receives are dropped.
pub fn ep_close(ep: u32) -> Result<(), i32> {
    with(|_, st| {
        st.remove_ep(ep).ok_or(FI_EINVAL)?;
        st.rma_drop_ep(ep);
        Ok(())
    })
}

/// What an endpoint is bound to.
pub enum Bind {
    /// A completion queue, for sends (`FI_TRANSMIT`), receives (`FI_RECV`) or both, with
    /// `FI_SELECTIVE_COMPLETION` or not.
    Cq(u64, u64),
    /// An address vector.
    Av(u64),
    /// A counter, for sends or receives.
    Cntr(u64, u64),
}

/// Bind `ep` to `what`.
pub fn ep_bind(ep: u32, what: Bind) -> Result<(), i32> {
    with(|_, st| {
        let known = match &what {
            Bind::Cq(c, _) => st.cqs.contains_key(c),
            Bind::Av(a) => st.avs.contains_key(a),
            Bind::Cntr(c, _) => st.cntrs.contains_key(c),
        };
        if !known {
            return Err(FI_EINVAL);
        }
        let e = st.ep(ep)?;
        if e.enabled && !matches!(what, Bind::Cntr(..)) {
            return Err(FI_EOPBADSTATE);
        }
        match what {
            Bind::Cq(c, flags) => {
                let selective = flags & FI_SELECTIVE_COMPLETION != 0;
                if flags & FI_TRANSMIT != 0 {
                    e.tx_cq = Some((c, selective));
                }
                if flags & FI_RECV_BIND != 0 {
                    e.rx_cq = Some((c, selective));
                }
            }
            Bind::Av(a) => e.av = Some(a),
            Bind::Cntr(c, flags) => {
                if flags & FI_SEND != 0 {
                    e.tx_cntr = Some(c);
                }
                if flags & FI_RECV != 0 {
                    e.rx_cntr = Some(c);
                }
                if flags & FI_READ != 0 {
                    e.rd_cntr = Some(c);
                }
                if flags & FI_WRITE != 0 {
                    e.wr_cntr = Some(c);
                }
            }
        }
        Ok(())
    })
}

/// Enable `ep`: it needs an address vector and a completion queue for each direction.
pub fn ep_enable(ep: u32) -> Result<(), i32> {
    with(|_, st| {
        let e = st.ep(ep)?;
        if e.av.is_none() {
            return Err(FI_ENOAV);
        }
        if e.tx_cq.is_none() && e.tx_cntr.is_none() || e.rx_cq.is_none() && e.rx_cntr.is_none() {
            return Err(FI_ENOCQ);
        }
        e.enabled = true;
        Ok(())
    })
}

/// The address of `ep`.
pub fn ep_name(ep: u32) -> Result<Addr, i32> {
    with(|p, st| st.eps.get(&ep).map(|_| (p.me, ep)).ok_or(FI_EINVAL))
}

/// `ep`'s `FI_OPT_MIN_MULTI_RECV`: set it to `set`, if given; its value.
pub fn ep_min_multi_recv(ep: u32, set: Option<usize>) -> Result<usize, i32> {
    with(|_, st| {
        let e = st.ep(ep)?;
        if let Some(v) = set {
            e.min_multi_recv = v;
        }
        Ok(e.min_multi_recv)
    })
}

/// Cancel `ep`'s posted receive of context `ctx`.
pub fn ep_cancel(ep: u32, ctx: usize) -> Result<(), i32> {
    with(|_, st| {
        let e = st.ep(ep)?;
        let (recv, tagged) = e.rx.cancel(ctx).ok_or(FI_ENOENT)?;
        let Some(cq) = e.rx_cq.and_then(|(c, _)| st.cqs.get_mut(&c)) else { return Ok(()) };
        let flags = FI_RECV | if tagged { FI_TAGGED } else { FI_MSG };
        let entry = Entry { ctx: recv.ctx, flags, src: FI_ADDR_UNSPEC, ..Entry::default() };
        let prov_errno = ProvErr::Cancelled as i32;
        cq.errors.push_back(ErrEntry { entry, olen: 0, err: FI_ECANCELED, prov_errno });
        Ok(())
    })
}

/// A send from `ep`: the bytes of `iov` to `dest` (an address of its vector), tagged with
/// `tag` or plain, with remote CQ `data` or none. The bytes are copied before this returns.
pub fn send(
    ep: u32,
    iov: &[Iov],
    dest: u64,
    tag: Option<u64>,
    data: Option<u64>,
    flags: u64,
    ctx: usize,
) -> Result<(), i32> {
    // No look for input first: a send needs none, and the reads of the queues look.
    with_state(|p, st| {
        p.progress_tx(st);
        let e = st.eps.get(&ep).ok_or(FI_EINVAL)?;
        if !e.enabled {
            return Err(FI_EOPBADSTATE);
        }
        if e.txq.len() >= TX_QUEUE_MAX {
            return Err(FI_EAGAIN);
        }
        let (to, completion) = st.prepare_tx(ep, dest, flags)?;
        let total = capacity(iov);
        if total > crate::ep::MSG_BYTES_MAX {
            return Err(FI_EMSGSIZE);
        }
        let class = if tag.is_some() { FI_TAGGED } else { FI_MSG };
        let done = TxDone { ep, ctx, flags: FI_SEND | class, len: total, completion };
        st.next_msg += 1;
        let header = Header {
            kind: Kind::Whole,
            tagged: tag.is_some(),
            has_data: data.is_some(),
            dst_ep: to.1,
            src_ep: ep,
            tag: tag.unwrap_or(0),
            data: data.unwrap_or(0),
            msg_id: st.next_msg,
            len_or_offset: 0,
            last: false,
        };
        // Nothing queued before it and small enough for one piece: straight into the ring.
        let idle = st.eps.get(&ep).is_some_and(|e| e.txq.is_empty());
        let now = if idle && to.0 != p.me && total <= FRAGMENT_BYTES_MAX {
            p.send_now(st, to.0, &header, iov)
        } else {
            Now::Wait
        };
        match now {
            Now::Sent(None) => st.tx_complete(done, None),
            Now::Sent(Some(op)) => {
                st.inflight.push_back((op, done));
                p.flush();
            }
            Now::Failed(e) => st.tx_complete(done, Some((e, ProvErr::PeerGone))),
            Now::Wait => {
                let src = Source::of(iov, flags);
                st.queue(ep, TxOp { dest: to, header, src, total, sent: 0, done: Some(done) });
                p.push(st, ep);
            }
        }
        Ok(())
    })
}

/// How a receive is posted.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvFlags {
    /// `FI_PEEK`.
    pub peek: bool,
    /// `FI_CLAIM`.
    pub claim: bool,
    /// `FI_DISCARD`.
    pub discard: bool,
    /// `FI_COMPLETION`.
    pub completion: bool,
    /// `FI_MULTI_RECV`.
    pub multi: bool,
}

/// A receive on `ep` into `iov`, from `src` (`FI_ADDR_UNSPEC`: anyone), of a tagged message
/// matching `(tag, ignore)` or a plain one.
pub fn recv(ep: u32, iov: Iovs, src: u64, tag: Option<(u64, u64)>, how: RecvFlags, ctx: usize) -> Result<(), i32> {
    // A posted receive meets what arrives whenever progress takes it: only a peek, which
    // answers now, looks for input first.
    with_state(|p, st| {
        if how.peek {
            p.progress(st);
        }
        let e = st.eps.get(&ep).ok_or(FI_EINVAL)?;
        if !e.enabled {
            return Err(FI_EOPBADSTATE);
        }
        // A claim names its message by the context of the peek that claimed it: its source
        // address means nothing (applications pass 0, which a map vector need not hold).
        let from = if src == FI_ADDR_UNSPEC || (how.claim && !how.peek) {
            None
        } else {
            let av = e.av.and_then(|a| st.avs.get(&a)).ok_or(FI_EOPBADSTATE)?;
            Some(av.resolve(src).ok_or(FI_EINVAL)?)
        };
        let selective = e.rx_cq.is_some_and(|(_, s)| s);
        let (t, ignore) = tag.unwrap_or((0, 0));
        let multi = how.multi.then_some(e.min_multi_recv);
        let completion = !selective || how.completion;
        let posted = Posted { ctx, iov, src: from, tag: t, ignore, completion, multi, release: false };
        let tagged = tag.is_some();
        let e = st.ep(ep)?;
        if how.peek {
            let found = e.rx.peek(&posted, tagged, how.claim, how.discard);
            let Some(cq) = e.rx_cq.and_then(|(c, _)| st.cqs.get_mut(&c)) else { return Ok(()) };
            let flags = FI_RECV | if tagged { FI_TAGGED } else { FI_MSG };
            match found {
                None => {
                    let entry = Entry { ctx, flags, src: FI_ADDR_UNSPEC, ..Entry::default() };
                    let prov_errno = ProvErr::NoMessage as i32;
                    cq.errors.push_back(ErrEntry { entry, olen: 0, err: FI_ENOMSG, prov_errno });
                }
                Some(seen) => {
                    let data_flag = if seen.data.is_some() { FI_REMOTE_CQ_DATA } else { 0 };
                    let entry = Entry {
                        ctx,
                        flags: flags | data_flag,
                        len: seen.len,
                        buf: 0,
                        data: seen.data.unwrap_or(0),
                        tag: seen.tag,
                        src: FI_ADDR_UNSPEC,
                    };
                    let src = st.src_addr(ep, seen.src);
                    if let Some(cq) = st.eps.get(&ep).and_then(|e| e.rx_cq).and_then(|(c, _)| st.cqs.get_mut(&c)) {
                        cq.entries.push_back(Entry { src, ..entry });
                    }
                }
            }
            return Ok(());
        }
        if how.multi {
            if tagged || how.claim {
                return Err(FI_EINVAL);
            }
            for d in e.rx.post_multi(posted)? {
                st.rx_complete(ep, d);
            }
            return Ok(());
        }
        let done = if how.claim { Some(e.rx.claim(posted, tagged, how.discard)?) } else { e.rx.post(posted, tagged)? };
        if let Some(d) = done {
            st.rx_complete(ep, d);
        }
        Ok(())
    })
}
