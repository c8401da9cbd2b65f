//! The calls on completion queues, counters and address vectors (each behind a number the
//! C side holds): opening, reading, waiting, closing.

use std::time::{Duration, Instant};

use crate::consts::*;
use crate::engine::{nap, with, with_state, WAIT_SLICE};
use crate::queues::{Addr, Av, Cntr, Cq, Entry, ErrEntry};

/// A completion queue of `format` (`FI_CQ_FORMAT_UNSPEC` is the context format).
pub fn cq_open(format: i32) -> Result<u64, i32> {
    if !(FI_CQ_FORMAT_UNSPEC..=FI_CQ_FORMAT_TAGGED).contains(&format) {
        return Err(FI_ENOSYS);
    }
    let format = if format == FI_CQ_FORMAT_UNSPEC { FI_CQ_FORMAT_CONTEXT } else { format };
    with(|_, st| {
        let h = st.handle();
        st.cqs.insert(h, Cq::new(format));
        Ok(h)
    })
}

/// Close completion queue `cq`; refused while an endpoint is bound to it.
pub fn cq_close(cq: u64) -> Result<(), i32> {
    with(|_, st| {
        if st.bound(cq) {
            return Err(FI_EBUSY);
        }
        st.cqs.remove(&cq).map(drop).ok_or(FI_EINVAL)
    })
}

/// Up to `max` completions of `cq`, each handed to `out` with the queue's format and its
/// place: how many. `FI_EAGAIN` when none, `FI_EAVAIL` when one in error waits.
pub fn cq_read(cq: u64, max: usize, out: &mut dyn FnMut(i32, usize, &Entry)) -> Result<usize, i32> {
    with_state(|p, st| {
        // The read right after one that returned completions makes no progress: an
        // application that drains its queue in a loop (Open MPI does) goes back to answer what
        // it got, and its answer carries the acknowledgement the edge transport holds for it;
        // a look now would send that in a frame of its own. The read after makes progress.
        if !std::mem::take(&mut st.just_read) {
            p.progress(st);
        }
        let q = st.cqs.get_mut(&cq).ok_or(FI_EINVAL)?;
        if !q.errors.is_empty() {
            return Err(FI_EAVAIL);
        }
        if q.entries.is_empty() {
            return Err(FI_EAGAIN);
        }
        let n = max.min(q.entries.len());
        let format = q.format;
        for (i, e) in q.entries.drain(..n).enumerate() {
            out(format, i, &e);
        }
        st.just_read = true;
        Ok(n)
    })
}

/// `fi_trywait` on completion queues `cqs` (after a round of progress): `FI_EAGAIN` when a
/// completion or input waits, so the application reads rather than sleeps.
pub fn trywait(cqs: &[u64]) -> Result<(), i32> {
    with(|p, st| p.trywait(st, cqs))
}

/// The descriptor an application sleeps on after a successful [`trywait`].
pub fn wait_fd() -> Result<i32, i32> {
    crate::engine::with_state(|p, _| Ok(p.wait_fd()))
}

/// [`cq_read`], waiting up to `timeout` (`None`: for ever) for a completion.
pub fn cq_sread(
    cq: u64,
    max: usize,
    timeout: Option<Duration>,
    out: &mut dyn FnMut(i32, usize, &Entry),
) -> Result<usize, i32> {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        match cq_read(cq, max, out) {
            Err(FI_EAGAIN) => {}
            other => return other,
        }
        let signaled = with(|_, st| Ok(st.cqs.get_mut(&cq).is_some_and(|q| std::mem::take(&mut q.signaled))))?;
        if signaled {
            return Err(FI_EAGAIN);
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return Err(FI_EAGAIN);
        }
        nap(left.unwrap_or(WAIT_SLICE))?;
    }
}

/// The next completion in error of `cq`.
pub fn cq_readerr(cq: u64) -> Result<ErrEntry, i32> {
    with(|_, st| st.cqs.get_mut(&cq).ok_or(FI_EINVAL)?.errors.pop_front().ok_or(FI_EAGAIN))
}

/// Wake a waiter of `cq`.
pub fn cq_signal(cq: u64) -> Result<(), i32> {
    with(|_, st| {
        st.cqs.get_mut(&cq).ok_or(FI_EINVAL)?.signaled = true;
        Ok(())
    })
}

/// A counter.
pub fn cntr_open() -> Result<u64, i32> {
    with(|_, st| {
        let h = st.handle();
        st.cntrs.insert(h, Cntr::default());
        Ok(h)
    })
}

/// Close counter `c`.
pub fn cntr_close(c: u64) -> Result<(), i32> {
    with(|_, st| {
        if st.bound(c) {
            return Err(FI_EBUSY);
        }
        st.cntrs.remove(&c).map(drop).ok_or(FI_EINVAL)
    })
}

/// Counter `c`'s values (completed, failed).
pub fn cntr_read(c: u64) -> Result<(u64, u64), i32> {
    with(|_, st| st.cntrs.get(&c).map(|c| (c.value, c.errors)).ok_or(FI_EINVAL))
}

/// Change counter `c`: `add` to its value (or its errors with `errors`), or `set` it.
pub fn cntr_change(c: u64, errors: bool, add: bool, v: u64) -> Result<(), i32> {
    with(|_, st| {
        let c = st.cntrs.get_mut(&c).ok_or(FI_EINVAL)?;
        let slot = if errors { &mut c.errors } else { &mut c.value };
        *slot = if add { slot.wrapping_add(v) } else { v };
        Ok(())
    })
}

/// Wait until counter `c` reaches `threshold`, up to `timeout`; `FI_EAVAIL` if it counts errors.
pub fn cntr_wait(c: u64, threshold: u64, timeout: Option<Duration>) -> Result<(), i32> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let (_, errors0) = cntr_read(c)?;
    loop {
        let (v, errors) = cntr_read(c)?;
        if v >= threshold {
            return Ok(());
        }
        if errors > errors0 {
            return Err(FI_EAVAIL);
        }
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if left == Some(Duration::ZERO) {
            return Err(FI_ETIMEDOUT);
        }
        nap(left.unwrap_or(WAIT_SLICE))?;
    }
}

/// An address vector of `kind`.
pub fn av_open(kind: i32) -> Result<u64, i32> {
    if ![FI_AV_UNSPEC, FI_AV_MAP, FI_AV_TABLE].contains(&kind) {
        return Err(FI_EINVAL);
    }
    with(|_, st| {
        let h = st.handle();
        st.avs.insert(h, Av::new(kind));
        Ok(h)
    })
}

/// Close address vector `av`.
pub fn av_close(av: u64) -> Result<(), i32> {
    with(|_, st| {
        if st.bound(av) {
            return Err(FI_EBUSY);
        }
        st.avs.remove(&av).ok_or(FI_EINVAL)?;
        st.members_changed();
        Ok(())
    })
}

/// Insert `addrs` into `av`: each its `fi_addr_t`, or `None` where it is malformed.
pub fn av_insert(av: u64, addrs: &[Option<Addr>]) -> Result<Vec<Option<u64>>, i32> {
    with(|_, st| {
        let av = st.avs.get_mut(&av).ok_or(FI_EINVAL)?;
        let fas = addrs.iter().map(|a| a.and_then(|a| av.insert(a).ok())).collect();
        st.members_changed();
        Ok(fas)
    })
}

/// Remove `fa` from `av`.
pub fn av_remove(av: u64, fa: u64) -> Result<(), i32> {
    with(|_, st| {
        st.avs.get_mut(&av).ok_or(FI_EINVAL)?.remove(fa)?;
        st.members_changed();
        Ok(())
    })
}

/// The address behind `fa` in `av`.
pub fn av_lookup(av: u64, fa: u64) -> Result<Addr, i32> {
    with(|_, st| st.avs.get(&av).ok_or(FI_EINVAL)?.resolve(fa).ok_or(FI_EINVAL))
}
