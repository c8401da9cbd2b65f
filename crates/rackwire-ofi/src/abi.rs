//! The functions the C side (`prov.c`, which holds libfabric's structures) calls: plain
//! numbers and pointers in, libfabric's negative error codes out. No panic crosses back:
//! each body runs under `catch_unwind`, and a panic is `-FI_EOTHER`.
#![allow(unsafe_code)]
#![allow(missing_docs)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use crate::atomics::{self, Form};
use crate::consts::*;
use crate::endpoint::{self, Bind, RecvFlags};
use crate::engine;
use crate::objects;
use crate::queues::{addr_bytes, addr_from, Entry, ProvErr, ADDR_BYTES};
use crate::rma;
use crate::user::{Iov, Iovs, RawIov};

/// Run `f`; its error (positive) negated, a panic as `-FI_EOTHER`.
fn guard(f: impl FnOnce() -> Result<i64, i32>) -> i64 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => -i64::from(e),
        Err(_) => -i64::from(FI_EOTHER),
    }
}

fn ok(r: Result<(), i32>) -> Result<i64, i32> {
    r.map(|()| 0)
}

/// Write `v` where the C side's out-pointer `out` points (`FI_EINVAL` for a null one).
fn put<T>(out: *mut T, v: T) -> Result<i64, i32> {
    // SAFETY: the C side passes a pointer to a `T` of its own, or null (refused).
    let slot = unsafe { out.as_mut() }.ok_or(FI_EINVAL)?;
    *slot = v;
    Ok(0)
}

/// The pieces of a C `iovec` array, read in place.
///
/// # Safety
/// `iov` points at `count` `struct iovec` (or `count` is 0), valid for `'a`.
unsafe fn iovs<'a>(iov: *const RawIov, count: usize) -> Result<&'a [Iov], i32> {
    if count == 0 {
        return Ok(&[]);
    }
    if iov.is_null() || count > IOV_LIMIT {
        return Err(FI_EINVAL);
    }
    // SAFETY: the caller passes `count` iovecs at `iov` (checked non-null above), valid for
    // the call; `Iov` is laid out as `RawIov` (both `repr(C)`: an address-sized word, then a
    // `usize`; checked below), and any address is a valid `usize`.
    Ok(unsafe { std::slice::from_raw_parts(iov.cast::<Iov>(), count) })
}

const _: () = assert!(
    std::mem::size_of::<Iov>() == std::mem::size_of::<RawIov>()
        && std::mem::align_of::<Iov>() == std::mem::align_of::<RawIov>()
);

/// Pieces one operation's buffer has at most (`iov_limit`).
pub const IOV_LIMIT: usize = 16;

/// The timeout of a blocking call: negative waits for ever.
fn timeout(ms: i32) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// Called in the child after a fork (the C side's `pthread_atfork` handler).
#[no_mangle]
pub extern "C" fn rwofi_forked() {
    engine::forked();
}

#[no_mangle]
pub extern "C" fn rwofi_configured() -> i32 {
    i32::from(engine::configured())
}

/// This process's address (its node, any endpoint) into `out` (8 bytes), joining the fabric
/// if it has not yet.
#[no_mangle]
pub extern "C" fn rwofi_src_addr(out: *mut u8) -> i64 {
    guard(|| {
        let node = engine::node_id()?;
        let bytes = crate::queues::addr_bytes((node, engine::ANY_EP));
        if out.is_null() {
            return Err(FI_EINVAL);
        }
        // SAFETY: the C side passes 8 bytes it allocated.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, bytes.len()) };
        Ok(0)
    })
}

/// A domain opened (`auto_progress`: with `FI_PROGRESS_AUTO`).
#[no_mangle]
pub extern "C" fn rwofi_domain_open(auto_progress: i32) -> i64 {
    guard(|| ok(engine::domain_open(auto_progress != 0)))
}

/// A domain closed (`auto_progress`: it was opened with `FI_PROGRESS_AUTO`).
#[no_mangle]
pub extern "C" fn rwofi_domain_close(auto_progress: i32) -> i64 {
    guard(|| {
        engine::domain_close(auto_progress != 0);
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn rwofi_cq_open(format: i32, out: *mut u64) -> i64 {
    guard(|| {
        let h = objects::cq_open(format)?;
        put(out, h)
    })
}

#[no_mangle]
pub extern "C" fn rwofi_cq_close(cq: u64) -> i64 {
    guard(|| ok(objects::cq_close(cq)))
}

/// The descriptor of the fabric's input, for `fi_control(FI_GETWAIT)`.
#[no_mangle]
pub extern "C" fn rwofi_wait_fd() -> i64 {
    guard(|| objects::wait_fd().map(i64::from))
}

/// `fi_trywait` on the `count` completion queues at `cqs`.
#[no_mangle]
pub extern "C" fn rwofi_trywait(cqs: *const u64, count: usize) -> i64 {
    guard(|| {
        if count > TRYWAIT_MAX || (count > 0 && cqs.is_null()) {
            return Err(FI_EINVAL);
        }
        let handles = if count == 0 {
            &[][..]
        } else {
            // SAFETY: the C side passes `count` handles at `cqs` (checked non-null above).
            unsafe { std::slice::from_raw_parts(cqs, count) }
        };
        ok(objects::trywait(handles))
    })
}

/// Queues one `fi_trywait` looks at, at most (the C side's `RW_TRYWAIT_MAX`).
pub const TRYWAIT_MAX: usize = 64;

/// Bytes of one entry of `format`.
fn entry_bytes(format: i32) -> usize {
    match format {
        FI_CQ_FORMAT_MSG => 24,
        FI_CQ_FORMAT_DATA => 40,
        FI_CQ_FORMAT_TAGGED => 48,
        _ => 8,
    }
}

/// `struct fi_cq_tagged_entry`: every format is a prefix of it.
#[repr(C)]
struct TaggedEntry {
    op_context: usize,
    flags: u64,
    len: usize,
    buf: usize,
    data: u64,
    tag: u64,
}

const _: () = assert!(std::mem::size_of::<TaggedEntry>() == 48);

/// Write entry `e` as the `i`th of `buf` in `format`, and its source as the `i`th of `src`
/// (if not null).
///
/// # Safety
/// `buf` holds more than `i` entries of `format`; `src`, if not null, as many `fi_addr_t`.
unsafe fn write_entry(format: i32, i: usize, e: &Entry, buf: *mut u8, src: *mut u64) {
    let size = entry_bytes(format);
    let full = TaggedEntry { op_context: e.ctx, flags: e.flags, len: e.len, buf: e.buf, data: e.data, tag: e.tag };
    // SAFETY: `buf` has room for entry `i` of `size` bytes (the caller's count bounded how
    // many were taken); `full` has at least `size` bytes.
    unsafe { std::ptr::copy_nonoverlapping((&full as *const TaggedEntry).cast::<u8>(), buf.add(i * size), size) };
    if !src.is_null() {
        // SAFETY: `src` has room for as many addresses as `buf` has entries.
        unsafe { *src.add(i) = e.src };
    }
}

/// `fi_cq_read`, `fi_cq_readfrom`, and their blocking forms (`blocking`, `timeout_ms`).
#[no_mangle]
pub extern "C" fn rwofi_cq_read(
    cq: u64,
    buf: *mut u8,
    count: usize,
    src: *mut u64,
    blocking: i32,
    timeout_ms: i32,
) -> i64 {
    guard(|| {
        if buf.is_null() || count == 0 {
            return Err(FI_EINVAL);
        }
        // SAFETY: the application's buffer holds `count` entries of the queue's format (and
        // `src`, if not null, `count` addresses); no more than `count` are taken.
        let out = &mut |format, i, e: &Entry| unsafe { write_entry(format, i, e, buf, src) };
        let n = if blocking != 0 {
            objects::cq_sread(cq, count, timeout(timeout_ms), out)?
        } else {
            objects::cq_read(cq, count, out)?
        };
        Ok(n as i64)
    })
}

/// The fields of `struct fi_cq_err_entry` the C side copies into the application's.
#[repr(C)]
pub struct RawErr {
    op_context: usize,
    flags: u64,
    len: usize,
    buf: usize,
    data: u64,
    tag: u64,
    olen: usize,
    err: i32,
    prov_errno: i32,
}

#[no_mangle]
pub extern "C" fn rwofi_cq_readerr(cq: u64, out: *mut RawErr) -> i64 {
    guard(|| {
        let e = objects::cq_readerr(cq)?;
        let raw = RawErr {
            op_context: e.entry.ctx,
            flags: e.entry.flags,
            len: e.entry.len,
            buf: e.entry.buf,
            data: e.entry.data,
            tag: e.entry.tag,
            olen: e.olen,
            err: e.err,
            prov_errno: e.prov_errno,
        };
        put(out, raw).map(|_| 1)
    })
}

/// The text of a provider error code: a static NUL-terminated string.
#[no_mangle]
pub extern "C" fn rwofi_strerror(prov_errno: i32) -> *const u8 {
    let text = ProvErr::text(prov_errno);
    text.as_ptr()
}

#[no_mangle]
pub extern "C" fn rwofi_cq_signal(cq: u64) -> i64 {
    guard(|| ok(objects::cq_signal(cq)))
}

#[no_mangle]
pub extern "C" fn rwofi_cntr_open(out: *mut u64) -> i64 {
    guard(|| {
        let h = objects::cntr_open()?;
        put(out, h)
    })
}

#[no_mangle]
pub extern "C" fn rwofi_cntr_close(c: u64) -> i64 {
    guard(|| ok(objects::cntr_close(c)))
}

/// The counter's value (`errors` 0) or its error count; `u64::MAX` on a bad counter.
#[no_mangle]
pub extern "C" fn rwofi_cntr_read(c: u64, errors: i32) -> u64 {
    catch_unwind(|| objects::cntr_read(c).map_or(u64::MAX, |(v, e)| if errors != 0 { e } else { v }))
        .unwrap_or(u64::MAX)
}

/// Add to (`add` 1) or set the counter's value (`errors` 0) or error count.
#[no_mangle]
pub extern "C" fn rwofi_cntr_change(c: u64, errors: i32, add: i32, v: u64) -> i64 {
    guard(|| ok(objects::cntr_change(c, errors != 0, add != 0, v)))
}

#[no_mangle]
pub extern "C" fn rwofi_cntr_wait(c: u64, threshold: u64, timeout_ms: i32) -> i64 {
    guard(|| ok(objects::cntr_wait(c, threshold, timeout(timeout_ms))))
}

#[no_mangle]
pub extern "C" fn rwofi_av_open(kind: i32, out: *mut u64) -> i64 {
    guard(|| {
        let h = objects::av_open(kind)?;
        put(out, h)
    })
}

#[no_mangle]
pub extern "C" fn rwofi_av_close(av: u64) -> i64 {
    guard(|| ok(objects::av_close(av)))
}

/// Insert `count` addresses of [`ADDR_BYTES`] each; `fi_addr` (if not null) gets each one's
/// `fi_addr_t` (`FI_ADDR_NOTAVAIL` for a bad one). The number inserted.
#[no_mangle]
pub extern "C" fn rwofi_av_insert(av: u64, addr: *const u8, count: usize, fi_addr: *mut u64) -> i64 {
    guard(|| {
        if count == 0 {
            return Ok(0);
        }
        if addr.is_null() || count > crate::queues::AV_ENTRIES_MAX {
            return Err(FI_EINVAL);
        }
        // SAFETY: the application passes `count` addresses of the length `fi_getname` gave.
        let raw = unsafe { std::slice::from_raw_parts(addr, count * ADDR_BYTES) };
        let addrs: Vec<_> = raw.chunks(ADDR_BYTES).map(addr_from).collect();
        let got = objects::av_insert(av, &addrs)?;
        if !fi_addr.is_null() {
            for (i, fa) in got.iter().enumerate() {
                // SAFETY: the application's array has room for `count` addresses.
                unsafe { *fi_addr.add(i) = fa.unwrap_or(FI_ADDR_UNSPEC) };
            }
        }
        Ok(got.iter().filter(|f| f.is_some()).count() as i64)
    })
}

#[no_mangle]
pub extern "C" fn rwofi_av_remove(av: u64, fi_addr: *const u64, count: usize) -> i64 {
    guard(|| {
        if count > 0 && fi_addr.is_null() {
            return Err(FI_EINVAL);
        }
        for i in 0..count {
            // SAFETY: the application passes `count` addresses.
            objects::av_remove(av, unsafe { *fi_addr.add(i) })?;
        }
        Ok(0)
    })
}

/// Write the address behind `fa` into `addr` (room `*len`); `*len` becomes its length.
#[no_mangle]
pub extern "C" fn rwofi_av_lookup(av: u64, fa: u64, addr: *mut u8, len: *mut usize) -> i64 {
    guard(|| {
        let a = objects::av_lookup(av, fa)?;
        // SAFETY: the C side checked `len`; `addr` has `*len` bytes.
        unsafe { put_name(a, addr, len) }
    })
}

/// # Safety
/// `len` points at the room of `addr` (which may be null when the room is 0).
unsafe fn put_name(a: crate::queues::Addr, addr: *mut u8, len: *mut usize) -> Result<i64, i32> {
    // SAFETY: as the caller says.
    let room = unsafe { len.as_mut() }.ok_or(FI_EINVAL)?;
    let bytes = addr_bytes(a);
    let fits = *room >= ADDR_BYTES && !addr.is_null();
    if fits {
        // SAFETY: `addr` has `*room >= ADDR_BYTES` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr, ADDR_BYTES) };
    }
    *room = ADDR_BYTES;
    if fits {
        Ok(0)
    } else {
        Err(FI_ETOOSMALL)
    }
}

#[no_mangle]
pub extern "C" fn rwofi_ep_open(out: *mut u64) -> i64 {
    guard(|| {
        let id = endpoint::ep_open()?;
        put(out, u64::from(id))
    })
}

fn ep_id(ep: u64) -> Result<u32, i32> {
    u32::try_from(ep).map_err(|_| FI_EINVAL)
}

#[no_mangle]
pub extern "C" fn rwofi_ep_close(ep: u64) -> i64 {
    guard(|| ok(endpoint::ep_close(ep_id(ep)?)))
}

/// Bind `ep` to a completion queue (`kind` 1), an address vector (2) or a counter (3).
#[no_mangle]
pub extern "C" fn rwofi_ep_bind(ep: u64, kind: i32, obj: u64, flags: u64) -> i64 {
    guard(|| {
        let what = match kind {
            1 => Bind::Cq(obj, flags),
            2 => Bind::Av(obj),
            3 => Bind::Cntr(obj, flags),
            _ => return Err(FI_EINVAL),
        };
        ok(endpoint::ep_bind(ep_id(ep)?, what))
    })
}

#[no_mangle]
pub extern "C" fn rwofi_ep_enable(ep: u64) -> i64 {
    guard(|| ok(endpoint::ep_enable(ep_id(ep)?)))
}

#[no_mangle]
pub extern "C" fn rwofi_ep_getname(ep: u64, addr: *mut u8, len: *mut usize) -> i64 {
    guard(|| {
        let a = endpoint::ep_name(ep_id(ep)?)?;
        // SAFETY: `len` is the room of `addr` (libfabric's contract for fi_getname).
        unsafe { put_name(a, addr, len) }
    })
}

/// `FI_OPT_MIN_MULTI_RECV` of `ep`: set from `*value` when `set`, then `*value` its value.
#[no_mangle]
pub extern "C" fn rwofi_ep_min_multi_recv(ep: u64, set: i32, value: *mut usize) -> i64 {
    guard(|| {
        // SAFETY: the C side passes a pointer to a size_t of the application's (checked).
        let v = unsafe { value.as_mut() }.ok_or(FI_EINVAL)?;
        *v = endpoint::ep_min_multi_recv(ep_id(ep)?, (set != 0).then_some(*v))?;
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn rwofi_ep_cancel(ep: u64, ctx: usize) -> i64 {
    guard(|| ok(endpoint::ep_cancel(ep_id(ep)?, ctx)))
}

/// A send: `tagged` and `has_data` say whether `tag` and `data` count.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn rwofi_send(
    ep: u64,
    iov: *const RawIov,
    count: usize,
    dest: u64,
    tagged: i32,
    tag: u64,
    has_data: i32,
    data: u64,
    flags: u64,
    ctx: usize,
) -> i64 {
    guard(|| {
        // SAFETY: the C side passes the application's `count` iovecs.
        let iov = unsafe { iovs(iov, count) }?;
        let tag = (tagged != 0).then_some(tag);
        let data = (has_data != 0).then_some(data);
        ok(endpoint::send(ep_id(ep)?, iov, dest, tag, data, flags, ctx))
    })
}

/// A receive: `tagged` says whether `tag` and `ignore` count.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn rwofi_recv(
    ep: u64,
    iov: *const RawIov,
    count: usize,
    src: u64,
    tagged: i32,
    tag: u64,
    ignore: u64,
    flags: u64,
    ctx: usize,
) -> i64 {
    guard(|| {
        // SAFETY: the C side passes the application's `count` iovecs.
        let iov = unsafe { iovs(iov, count) }?;
        let how = RecvFlags {
            peek: flags & FI_PEEK != 0,
            claim: flags & FI_CLAIM != 0,
            discard: flags & FI_DISCARD != 0,
            completion: flags & FI_COMPLETION != 0,
            multi: flags & FI_MULTI_RECV != 0,
        };
        let tag = (tagged != 0).then_some((tag, ignore));
        ok(endpoint::recv(ep_id(ep)?, iov.into(), src, tag, how, ctx))
    })
}

#[no_mangle]
pub extern "C" fn rwofi_mr_reg(buf: *const u8, len: usize, access: u64, key: *mut u64) -> i64 {
    guard(|| {
        let k = rma::mr_reg(buf as usize, len, access)?;
        put(key, k)
    })
}

#[no_mangle]
pub extern "C" fn rwofi_mr_close(key: u64) -> i64 {
    guard(|| ok(rma::mr_close(key)))
}

/// An RMA write (`read` 0) or read (`read` 1) of the application's `count` iovecs.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn rwofi_rma(
    ep: u64,
    read: i32,
    iov: *const RawIov,
    count: usize,
    peer: u64,
    addr: u64,
    key: u64,
    has_data: i32,
    data: u64,
    flags: u64,
    ctx: usize,
) -> i64 {
    guard(|| {
        // SAFETY: the C side passes the application's `count` iovecs.
        let iov = unsafe { iovs(iov, count) }?;
        let ep = ep_id(ep)?;
        if read != 0 {
            ok(rma::read(ep, iov.into(), peer, addr, key, flags, ctx))
        } else {
            let data = (has_data != 0).then_some(data);
            ok(rma::write(ep, iov, peer, addr, key, data, flags, ctx))
        }
    })
}

/// `n` bytes at `p`, or none for a null pointer.
///
/// # Safety
/// `p` is null or points at `n` readable bytes.
unsafe fn bytes<'a>(p: *const u8, n: usize) -> &'a [u8] {
    if p.is_null() {
        &[]
    } else {
        // SAFETY: as the caller says.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

/// An atomic: `form` 0 write, 1 fetch, 2 compare; `count` elements of `dt` at `buf` (and
/// `compare`), the old values into `result`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn rwofi_atomic(
    ep: u64,
    form: i32,
    dt: i32,
    op: i32,
    buf: *const u8,
    count: usize,
    compare: *const u8,
    result: *mut u8,
    peer: u64,
    addr: u64,
    key: u64,
    flags: u64,
    ctx: usize,
) -> i64 {
    guard(|| {
        let form = u8::try_from(form).ok().and_then(Form::from_code).ok_or(FI_EINVAL)?;
        let size = atomics::elem_bytes(dt).ok_or(FI_EOPNOTSUPP)?;
        if count > atomics::count_max(dt) {
            return Err(FI_EINVAL);
        }
        let n = size * count;
        // SAFETY: the application passes `count` elements at `buf` (and at `compare` for the
        // compare form); a read passes none.
        let operands = unsafe { bytes(buf, n) };
        let compares = if form == Form::Compare {
            if compare.is_null() {
                return Err(FI_EINVAL);
            }
            // SAFETY: as above.
            unsafe { bytes(compare, n) }
        } else {
            &[]
        };
        let result = match form {
            Form::Write => Iovs::from(&[][..]),
            _ if result.is_null() => return Err(FI_EINVAL),
            _ => Iovs::one(Iov { base: result as usize, len: n }),
        };
        let call = rma::AtomicCall { form, dt, op, count, operands, compares, result };
        ok(rma::atomic(ep_id(ep)?, call, peer, addr, key, flags, ctx))
    })
}

/// Whether `op` on `dt` in `form` is done, and how many elements one call may carry.
#[no_mangle]
pub extern "C" fn rwofi_atomic_valid(dt: i32, op: i32, form: i32, count: *mut usize) -> i64 {
    guard(|| {
        let form = u8::try_from(form).ok().and_then(Form::from_code).ok_or(FI_EINVAL)?;
        let n = rma::atomic_valid(dt, op, form)?;
        // SAFETY: the C side passes a pointer to its own size_t, or null.
        if let Some(c) = unsafe { count.as_mut() } {
            *c = n;
        }
        Ok(0)
    })
}
