//! Groups of ranks and their collectives.

use rackwire_coll::{Element, Group, ReduceOp};

use crate::ptr::{boxed, bytes, bytes_mut, free, put};
use crate::status::{arg, guard, Fail, RwStatus};
use crate::types::*;

// ---- groups ----

fn group<'a>(g: *mut RwGroup) -> Result<&'a mut Group, Fail> {
    // SAFETY: a live handle this library handed out, used by one thread at a time (the
    // header's contract for RwGroup).
    let g = unsafe { g.as_mut() }.ok_or_else(|| arg("group"))?;
    g.0.as_mut().ok_or_else(|| Fail::Arg("the group was left".into()))
}

/// Join the job the environment describes (rackwire launch, mpirun, srun, ...).
#[no_mangle]
pub extern "C" fn rw_group_from_env(out: *mut *mut RwGroup) -> RwStatus {
    guard(|| boxed(out, RwGroup(Some(Group::from_env()?)), "out"))
}

/// This process's rank.
#[no_mangle]
pub extern "C" fn rw_group_rank(g: *mut RwGroup, out: *mut u32) -> RwStatus {
    guard(|| put(out, group(g)?.rank() as u32, "out"))
}

/// The number of ranks.
#[no_mangle]
pub extern "C" fn rw_group_size(g: *mut RwGroup, out: *mut u32) -> RwStatus {
    guard(|| put(out, group(g)?.size() as u32, "out"))
}

/// Wait until every rank is here.
#[no_mangle]
pub extern "C" fn rw_group_barrier(g: *mut RwGroup) -> RwStatus {
    guard(|| Ok(group(g)?.barrier()?))
}

/// Rank `root`'s `len` bytes at `buf` into every rank's `buf`.
#[no_mangle]
pub extern "C" fn rw_group_bcast(g: *mut RwGroup, root: u32, buf: *mut u8, len: usize) -> RwStatus {
    guard(|| Ok(group(g)?.bcast(root as usize, bytes_mut(buf, len, "buf")?)?))
}

/// Every rank's `len` bytes, by rank, into every rank's `recv` (`len` times the ranks).
#[no_mangle]
pub extern "C" fn rw_group_allgather(g: *mut RwGroup, send: *const u8, len: usize, recv: *mut u8) -> RwStatus {
    guard(|| {
        let g = group(g)?;
        let total = blocks(len, g.size())?;
        Ok(g.allgather(bytes(send, len, "send")?, bytes_mut(recv, total, "recv")?)?)
    })
}

/// Block `j` of `send` (`block` bytes each) to rank `j`; block `j` of `recv` from rank `j`.
#[no_mangle]
pub extern "C" fn rw_group_alltoall(g: *mut RwGroup, send: *const u8, block: usize, recv: *mut u8) -> RwStatus {
    guard(|| {
        let g = group(g)?;
        let total = blocks(block, g.size())?;
        Ok(g.alltoall(bytes(send, total, "send")?, bytes_mut(recv, total, "recv")?)?)
    })
}

/// `n` counts at `p` (bytes per rank), checked.
fn counts_at<'a>(p: *const usize, n: usize, what: &str) -> Result<&'a [usize], Fail> {
    if p.is_null() {
        return Err(arg(what));
    }
    // SAFETY: non-null; the caller passes one count per rank, left alone during the call.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

/// The bytes `counts` add up to.
fn total(counts: &[usize], what: &str) -> Result<usize, Fail> {
    counts.iter().try_fold(0usize, |a, &c| a.checked_add(c)).ok_or_else(|| Fail::Arg(format!("{what} overflow")))
}

/// `block` bytes once per rank.
fn blocks(block: usize, ranks: usize) -> Result<usize, Fail> {
    block.checked_mul(ranks).ok_or_else(|| Fail::Arg("block too large".into()))
}

/// Rank `root`'s `send` (`block` bytes per rank, by rank) cut into blocks: block `j` into rank
/// `j`'s `recv` (`block` bytes). `send` is read at `root` only (NULL elsewhere).
#[no_mangle]
pub extern "C" fn rw_group_scatter(
    g: *mut RwGroup,
    root: u32,
    send: *const u8,
    block: usize,
    recv: *mut u8,
) -> RwStatus {
    guard(|| {
        let g = group(g)?;
        let send = if g.rank() == root as usize { bytes(send, blocks(block, g.size())?, "send")? } else { &[] };
        Ok(g.scatter(root as usize, send, bytes_mut(recv, block, "recv")?)?)
    })
}

/// Rank `root`'s `send` cut by `counts` (one per rank, bytes): `counts[j]` bytes into rank
/// `j`'s `recv` (`recv_len` bytes, which must equal its count). `send` and `counts` are read
/// at `root` only (NULL elsewhere).
#[no_mangle]
pub extern "C" fn rw_group_scatterv(
    g: *mut RwGroup,
    root: u32,
    send: *const u8,
    counts: *const usize,
    recv: *mut u8,
    recv_len: usize,
) -> RwStatus {
    guard(|| {
        let g = group(g)?;
        let (send, counts) = if g.rank() == root as usize {
            let c = counts_at(counts, g.size(), "counts")?;
            (bytes(send, total(c, "counts")?, "send")?, c)
        } else {
            (&[][..], &[][..])
        };
        Ok(g.scatterv(root as usize, send, counts, bytes_mut(recv, recv_len, "recv")?)?)
    })
}

/// Every rank's `block` bytes at `send`, by rank, into rank `root`'s `recv` (`block` times the
/// ranks; read at `root` only, NULL elsewhere).
#[no_mangle]
pub extern "C" fn rw_group_gather(
    g: *mut RwGroup,
    root: u32,
    send: *const u8,
    block: usize,
    recv: *mut u8,
) -> RwStatus {
    guard(|| {
        let g = group(g)?;
        let recv = if g.rank() == root as usize { bytes_mut(recv, blocks(block, g.size())?, "recv")? } else { &mut [] };
        Ok(g.gather(root as usize, bytes(send, block, "send")?, recv)?)
    })
}

/// Every rank's `send_len` bytes, by rank, into rank `root`'s `recv`, rank `j`'s taking
/// `counts[j]` bytes (which must equal what it sends). `counts` and `recv` are used at `root`
/// only (NULL elsewhere).
#[no_mangle]
pub extern "C" fn rw_group_gatherv(
    g: *mut RwGroup,
    root: u32,
    send: *const u8,
    send_len: usize,
    counts: *const usize,
    recv: *mut u8,
) -> RwStatus {
    guard(|| {
        let g = group(g)?;
        let (counts, recv) = if g.rank() == root as usize {
            let c = counts_at(counts, g.size(), "counts")?;
            (c, bytes_mut(recv, total(c, "counts")?, "recv")?)
        } else {
            (&[][..], &mut [][..])
        };
        Ok(g.gatherv(root as usize, bytes(send, send_len, "send")?, counts, recv)?)
    })
}

/// Every rank's `send_len` bytes, by rank, into every rank's `recv`, rank `j`'s taking
/// `counts[j]` bytes (one count per rank, the same at every rank).
#[no_mangle]
pub extern "C" fn rw_group_allgatherv(
    g: *mut RwGroup,
    send: *const u8,
    send_len: usize,
    counts: *const usize,
    recv: *mut u8,
) -> RwStatus {
    guard(|| {
        let g = group(g)?;
        let c = counts_at(counts, g.size(), "counts")?;
        Ok(g.allgatherv(bytes(send, send_len, "send")?, c, bytes_mut(recv, total(c, "counts")?, "recv")?)?)
    })
}

/// `send_counts[j]` bytes of `send` (packed by rank) to rank `j`, and `recv_counts[j]` bytes
/// from rank `j` into `recv` (packed by rank); a count must equal its sender's.
#[no_mangle]
pub extern "C" fn rw_group_alltoallv(
    g: *mut RwGroup,
    send: *const u8,
    send_counts: *const usize,
    recv: *mut u8,
    recv_counts: *const usize,
) -> RwStatus {
    guard(|| {
        let g = group(g)?;
        let sc = counts_at(send_counts, g.size(), "send_counts")?;
        let rc = counts_at(recv_counts, g.size(), "recv_counts")?;
        let send = bytes(send, total(sc, "send_counts")?, "send")?;
        Ok(g.alltoallv(send, sc, bytes_mut(recv, total(rc, "recv_counts")?, "recv")?, rc)?)
    })
}

/// A reduction named by its `RW_REDUCE_*` code.
fn reduce_op(op: u32) -> Result<ReduceOp, Fail> {
    Ok(match op {
        RW_REDUCE_SUM => ReduceOp::Sum,
        RW_REDUCE_MIN => ReduceOp::Min,
        RW_REDUCE_MAX => ReduceOp::Max,
        RW_REDUCE_PRODUCT => ReduceOp::Prod,
        other => return Err(Fail::Arg(format!("reduction {other}: one of RW_REDUCE_SUM, _MIN, _MAX, _PRODUCT"))),
    })
}

/// `n` elements at `data`, checked.
fn elements<'a, T>(data: *mut T, n: usize) -> Result<&'a mut [T], Fail> {
    if n == 0 {
        return Ok(&mut []);
    }
    if data.is_null() {
        return Err(arg("data"));
    }
    // SAFETY: non-null, aligned for the type (the caller's array), `n` long, not used by
    // anyone else during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(data, n) })
}

/// Reduce over the ranks: at `root` (`Some`) or at every rank.
fn reduction<T: Element>(g: *mut RwGroup, root: Option<u32>, data: *mut T, n: usize, op: u32) -> RwStatus {
    guard(|| {
        let (g, op, v) = (group(g)?, reduce_op(op)?, elements(data, n)?);
        match root {
            Some(root) => g.reduce(root as usize, v, op)?,
            None => g.allreduce(v, op)?,
        }
        Ok(())
    })
}

/// Reduce `n` u64 values over the ranks with `op` (`RW_REDUCE_*`), the result in `data` of rank
/// `root` (elsewhere `data` is scratch).
#[no_mangle]
pub extern "C" fn rw_group_reduce_u64(g: *mut RwGroup, root: u32, data: *mut u64, n: usize, op: u32) -> RwStatus {
    reduction(g, Some(root), data, n, op)
}

/// Reduce `n` u64 values over the ranks with `op` (`RW_REDUCE_*`), the result at every rank.
#[no_mangle]
pub extern "C" fn rw_group_allreduce_u64(g: *mut RwGroup, data: *mut u64, n: usize, op: u32) -> RwStatus {
    reduction(g, None, data, n, op)
}

/// Reduce `n` i64 values over the ranks with `op` (`RW_REDUCE_*`), the result in `data` of rank
/// `root` (elsewhere `data` is scratch).
#[no_mangle]
pub extern "C" fn rw_group_reduce_i64(g: *mut RwGroup, root: u32, data: *mut i64, n: usize, op: u32) -> RwStatus {
    reduction(g, Some(root), data, n, op)
}

/// Reduce `n` i64 values over the ranks with `op` (`RW_REDUCE_*`), the result at every rank.
#[no_mangle]
pub extern "C" fn rw_group_allreduce_i64(g: *mut RwGroup, data: *mut i64, n: usize, op: u32) -> RwStatus {
    reduction(g, None, data, n, op)
}

/// Reduce `n` u32 values over the ranks with `op` (`RW_REDUCE_*`), the result in `data` of rank
/// `root` (elsewhere `data` is scratch).
#[no_mangle]
pub extern "C" fn rw_group_reduce_u32(g: *mut RwGroup, root: u32, data: *mut u32, n: usize, op: u32) -> RwStatus {
    reduction(g, Some(root), data, n, op)
}

/// Reduce `n` u32 values over the ranks with `op` (`RW_REDUCE_*`), the result at every rank.
#[no_mangle]
pub extern "C" fn rw_group_allreduce_u32(g: *mut RwGroup, data: *mut u32, n: usize, op: u32) -> RwStatus {
    reduction(g, None, data, n, op)
}

/// Reduce `n` i32 values over the ranks with `op` (`RW_REDUCE_*`), the result in `data` of rank
/// `root` (elsewhere `data` is scratch).
#[no_mangle]
pub extern "C" fn rw_group_reduce_i32(g: *mut RwGroup, root: u32, data: *mut i32, n: usize, op: u32) -> RwStatus {
    reduction(g, Some(root), data, n, op)
}

/// Reduce `n` i32 values over the ranks with `op` (`RW_REDUCE_*`), the result at every rank.
#[no_mangle]
pub extern "C" fn rw_group_allreduce_i32(g: *mut RwGroup, data: *mut i32, n: usize, op: u32) -> RwStatus {
    reduction(g, None, data, n, op)
}

/// Reduce `n` f64 values over the ranks with `op` (`RW_REDUCE_*`), the result in `data` of rank
/// `root` (elsewhere `data` is scratch).
#[no_mangle]
pub extern "C" fn rw_group_reduce_f64(g: *mut RwGroup, root: u32, data: *mut f64, n: usize, op: u32) -> RwStatus {
    reduction(g, Some(root), data, n, op)
}

/// Reduce `n` f64 values over the ranks with `op` (`RW_REDUCE_*`), the result at every rank.
#[no_mangle]
pub extern "C" fn rw_group_allreduce_f64(g: *mut RwGroup, data: *mut f64, n: usize, op: u32) -> RwStatus {
    reduction(g, None, data, n, op)
}

/// Reduce `n` f32 values over the ranks with `op` (`RW_REDUCE_*`), the result in `data` of rank
/// `root` (elsewhere `data` is scratch).
#[no_mangle]
pub extern "C" fn rw_group_reduce_f32(g: *mut RwGroup, root: u32, data: *mut f32, n: usize, op: u32) -> RwStatus {
    reduction(g, Some(root), data, n, op)
}

/// Reduce `n` f32 values over the ranks with `op` (`RW_REDUCE_*`), the result at every rank.
#[no_mangle]
pub extern "C" fn rw_group_allreduce_f32(g: *mut RwGroup, data: *mut f32, n: usize, op: u32) -> RwStatus {
    reduction(g, None, data, n, op)
}

/// Leave the group together with the other ranks (a last barrier) and free the handle.
#[no_mangle]
pub extern "C" fn rw_group_leave(g: *mut RwGroup) -> RwStatus {
    let st = guard(|| {
        // SAFETY: a live handle this library handed out (the header's contract).
        let h = unsafe { g.as_mut() }.ok_or_else(|| arg("group"))?;
        match h.0.take() {
            Some(grp) => Ok(grp.leave()?),
            None => Ok(()),
        }
    });
    free(g);
    st
}
