//! Connections, one-sided operations and their handles, messages, counters.

use std::time::Duration;

use rackwire::{Completion, Error, Op, RemoteRegion, Signal};

use crate::ptr::{boxed, bytes, bytes_mut, flags, free, obj, put, remote, switch};
use crate::status::{arg, guard, Fail, RwStatus};
use crate::types::*;

// ---- connections and operations ----

/// A connection to `node`.
#[no_mangle]
pub extern "C" fn rw_connect(f: *const RwFabric, node: u32, out: *mut *mut RwConn) -> RwStatus {
    guard(|| boxed(out, RwConn(obj(f, "fabric")?.0.connect(node)?), "out"))
}

/// Free a connection handle.
#[no_mangle]
pub extern "C" fn rw_conn_free(c: *mut RwConn) {
    free(c);
}

fn start(out: *mut *mut RwOp, f: impl FnOnce() -> Result<Op, Fail>) -> RwStatus {
    guard(|| {
        if out.is_null() {
            return Err(arg("out"));
        }
        boxed(out, RwOp { op: Some(f()?), outcome: None }, "out")
    })
}

/// Write `len` bytes at `offset` of the target region. The bytes are taken before the call
/// returns; the operation's handle says when they are in place.
#[no_mangle]
pub extern "C" fn rw_write(
    c: *const RwConn,
    target: *const RwRemoteRegion,
    offset: u64,
    data: *const u8,
    len: usize,
    fl: RwOpFlags,
    out: *mut *mut RwOp,
) -> RwStatus {
    start(out, || {
        let (c, t, d) = write_args(c, target, data, len)?;
        Ok(c.0.write(&t, offset, d, flags(fl)?))
    })
}

/// The connection, target and bytes of a write, checked.
fn write_args<'a>(
    c: *const RwConn,
    target: *const RwRemoteRegion,
    data: *const u8,
    len: usize,
) -> Result<(&'a RwConn, RemoteRegion, &'a [u8]), Fail> {
    Ok((obj(c, "connection")?, remote(target)?, bytes(data, len, "data")?))
}

/// Write `len` bytes at `offset` of the target region and wait until they are in place: a
/// write and its wait in one call, with no operation handle to free.
#[no_mangle]
pub extern "C" fn rw_write_wait(
    c: *const RwConn,
    target: *const RwRemoteRegion,
    offset: u64,
    data: *const u8,
    len: usize,
    fl: RwOpFlags,
) -> RwStatus {
    guard(|| {
        // Checked and waited for in place: values handed back through `Result`s are copied on
        // the way, and the loads of each copy stall on the stores that had just written it
        // (about a fifth of a small write's time through this call).
        let conn = obj(c, "connection")?;
        let t = remote(target)?;
        let d = bytes(data, len, "data")?;
        conn.0.write(&t, offset, d, flags(fl)?).wait().map(drop).map_err(Fail::from)
    })
}

/// Write `len` bytes at `offset` of the target region, then update the 64-bit signal word at
/// `signal_offset` of the same region: store `signal_value` (`signal_add` false; needs write
/// access), or add it atomically (`signal_add` true; needs atomic access). A reader that sees
/// the word changed finds the data in place (`rw_region_wait_u64` on the owner's side).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn rw_write_signal(
    c: *const RwConn,
    target: *const RwRemoteRegion,
    offset: u64,
    data: *const u8,
    len: usize,
    signal_offset: u64,
    signal_value: u64,
    signal_add: u8,
    fl: RwOpFlags,
    out: *mut *mut RwOp,
) -> RwStatus {
    start(out, || {
        let signal = if switch(signal_add, "signal_add")? {
            Signal::add(signal_offset, signal_value)
        } else {
            Signal::set(signal_offset, signal_value)
        };
        let data = bytes(data, len, "data")?;
        Ok(obj(c, "connection")?.0.write_signal(&remote(target)?, offset, data, signal, flags(fl)?))
    })
}

/// Write several pieces into the target region, all or nothing (the notification, if any,
/// once all are in place).
#[no_mangle]
pub extern "C" fn rw_write_batch(
    c: *const RwConn,
    target: *const RwRemoteRegion,
    entries: *const RwBatchEntry,
    n: usize,
    fl: RwOpFlags,
    out: *mut *mut RwOp,
) -> RwStatus {
    start(out, || {
        if n > rackwire::BATCH_ENTRIES_MAX {
            return Err(Fail::Rw(Error::Limit(rackwire::Limit::BatchEntries { n })));
        }
        let list: &[RwBatchEntry] = if n == 0 {
            &[]
        } else if entries.is_null() {
            return Err(arg("entries"));
        } else {
            // SAFETY: non-null, and the caller passes `n` entries.
            unsafe { std::slice::from_raw_parts(entries, n) }
        };
        let pieces: Vec<(u64, &[u8])> =
            list.iter().map(|e| Ok((e.offset, bytes(e.data, e.len, "entry data")?))).collect::<Result<_, Fail>>()?;
        Ok(obj(c, "connection")?.0.write_batch(&remote(target)?, &pieces, flags(fl)?))
    })
}

/// Read `len` bytes at `offset` of the target region (take them with rw_op_data).
#[no_mangle]
pub extern "C" fn rw_read(
    c: *const RwConn,
    target: *const RwRemoteRegion,
    offset: u64,
    len: u64,
    fl: RwOpFlags,
    out: *mut *mut RwOp,
) -> RwStatus {
    start(out, || Ok(obj(c, "connection")?.0.read(&remote(target)?, offset, len, flags(fl)?)))
}

/// Compare-and-swap the 8-byte word at `offset` (the old value with rw_op_value).
#[no_mangle]
pub extern "C" fn rw_compare_swap(
    c: *const RwConn,
    target: *const RwRemoteRegion,
    offset: u64,
    expected: u64,
    new_value: u64,
    fl: RwOpFlags,
    out: *mut *mut RwOp,
) -> RwStatus {
    start(out, || Ok(obj(c, "connection")?.0.compare_swap(&remote(target)?, offset, expected, new_value, flags(fl)?)))
}

/// Fetch-and-add on the 8-byte word at `offset` (the old value with rw_op_value).
#[no_mangle]
pub extern "C" fn rw_fetch_add(
    c: *const RwConn,
    target: *const RwRemoteRegion,
    offset: u64,
    add: u64,
    fl: RwOpFlags,
    out: *mut *mut RwOp,
) -> RwStatus {
    start(out, || Ok(obj(c, "connection")?.0.fetch_add(&remote(target)?, offset, add, flags(fl)?)))
}

fn op_mut<'a>(op: *mut RwOp) -> Result<&'a mut RwOp, Fail> {
    // SAFETY: a live handle this library handed out, used by one thread at a time (the
    // header's contract for RwOp).
    unsafe { op.as_mut() }.ok_or_else(|| arg("operation"))
}

impl RwOp {
    /// The operation's error, if it failed.
    fn result(&self) -> Result<(), Fail> {
        match &self.outcome {
            Some(Err(e)) => Err(Fail::Rw(e.clone())),
            _ => Ok(()),
        }
    }
}

/// Look whether the operation finished: `*done` says; its error, if it failed.
#[no_mangle]
pub extern "C" fn rw_op_poll(op: *mut RwOp, done: *mut bool) -> RwStatus {
    guard(|| {
        let o = op_mut(op)?;
        if o.outcome.is_none() {
            if let Some(r) = o.op.as_mut().and_then(Op::poll) {
                o.outcome = Some(r);
                o.op = None;
            }
        }
        put(done, o.outcome.is_some(), "done")?;
        o.result()
    })
}

/// Wait for the operation (up to the fabric's operation timeout); its error, if it failed.
#[no_mangle]
pub extern "C" fn rw_op_wait(op: *mut RwOp) -> RwStatus {
    guard(|| {
        let o = op_mut(op)?;
        if let Some(p) = o.op.take() {
            o.outcome = Some(p.wait());
        }
        o.result()
    })
}

/// Wait at most `timeout_ms` for the operation: RW_STATUS_TIMEOUT if it is still running
/// (wait again or free it), else its outcome.
#[no_mangle]
pub extern "C" fn rw_op_wait_timeout(op: *mut RwOp, timeout_ms: u64) -> RwStatus {
    guard(|| {
        let o = op_mut(op)?;
        if let Some(p) = o.op.as_mut() {
            match p.wait_timeout(Duration::from_millis(timeout_ms)) {
                Err(Error::Timeout) if !p.is_done() => return Err(Fail::Rw(Error::Timeout)),
                r => {
                    o.outcome = Some(r);
                    o.op = None;
                }
            }
        }
        o.result()
    })
}

/// A finished atomic's old value.
#[no_mangle]
pub extern "C" fn rw_op_value(op: *mut RwOp, out: *mut u64) -> RwStatus {
    guard(|| {
        let o = op_mut(op)?;
        o.result()?;
        match &o.outcome {
            Some(Ok(Completion::Value(v))) => put(out, *v, "out"),
            Some(Ok(_)) => Err(Fail::Arg("the operation returned no value (not an atomic)".into())),
            _ => Err(Fail::NotReady),
        }
    })
}

/// A finished read's bytes into `buf` (`cap` bytes), their count in `*out_len`.
#[no_mangle]
pub extern "C" fn rw_op_data(op: *mut RwOp, buf: *mut u8, cap: usize, out_len: *mut usize) -> RwStatus {
    guard(|| {
        let o = op_mut(op)?;
        o.result()?;
        match &o.outcome {
            Some(Ok(Completion::Data(d))) => {
                put(out_len, d.len(), "out_len")?;
                let dst = bytes_mut(buf, cap, "buf")?;
                if d.len() > cap {
                    return Err(Fail::Arg(format!("{} bytes read, {cap} bytes of room", d.len())));
                }
                dst[..d.len()].copy_from_slice(d);
                Ok(())
            }
            Some(Ok(_)) => Err(Fail::Arg("the operation returned no data (not a read)".into())),
            _ => Err(Fail::NotReady),
        }
    })
}

/// Free an operation handle (an operation still in flight goes on; its outcome is dropped).
#[no_mangle]
pub extern "C" fn rw_op_free(op: *mut RwOp) {
    free(op);
}

/// Send a message to the connection's peer and wait until it is placed.
#[no_mangle]
pub extern "C" fn rw_send(c: *const RwConn, data: *const u8, len: usize) -> RwStatus {
    guard(|| obj(c, "connection")?.0.send(bytes(data, len, "data")?).wait().map(drop).map_err(Fail::from))
}

/// Send a datagram to the connection's peer: delivered at most once, as a message, or not at
/// all, with nothing to wait for (IP packets and the like, which recover on their own).
/// RW_STATUS_MESSAGE_TOO_LARGE past one edge frame's payload (or the largest message),
/// RW_STATUS_LIMIT when the transport's queue or the peer's ring is full: nothing is sent.
#[no_mangle]
pub extern "C" fn rw_send_datagram(c: *const RwConn, data: *const u8, len: usize) -> RwStatus {
    guard(|| obj(c, "connection")?.0.send_datagram(bytes(data, len, "data")?).map_err(Fail::from))
}

/// Wait up to `timeout_ms` for the next message from the connection's peer, into `buf`.
#[no_mangle]
pub extern "C" fn rw_recv(
    c: *const RwConn,
    timeout_ms: u64,
    buf: *mut u8,
    cap: usize,
    out_len: *mut usize,
) -> RwStatus {
    guard(|| {
        let m = obj(c, "connection")?.0.recv_timeout(Duration::from_millis(timeout_ms))?;
        put(out_len, m.len(), "out_len")?;
        let dst = bytes_mut(buf, cap, "buf")?;
        if m.len() > cap {
            return Err(Fail::Arg(format!("a {}-byte message does not fit {cap} bytes", m.len())));
        }
        dst[..m.len()].copy_from_slice(&m);
        Ok(())
    })
}

/// The connection's counters.
#[no_mangle]
pub extern "C" fn rw_conn_stats(c: *const RwConn, out: *mut RwConnStats) -> RwStatus {
    guard(|| {
        let s = obj(c, "connection")?.0.stats();
        let e = s.edge_or_zero();
        put(
            out,
            RwConnStats {
                writes: s.writes,
                reads: s.reads,
                atomics: s.atomics,
                bytes_written: s.bytes_written,
                bytes_read: s.bytes_read,
                messages_sent: s.messages_sent,
                refused: s.refused,
                frames_sent: e.frames_sent,
                frames_received: e.frames_received,
                retransmits: e.retransmits,
            },
            "out",
        )
    })
}
