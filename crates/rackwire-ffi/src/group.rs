//! Groups of ranks and their collectives.

use rackwire_coll::{Group, ReduceOp};

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
        let total = len.checked_mul(g.size()).ok_or_else(|| Fail::Arg("len too large".into()))?;
        Ok(g.allgather(bytes(send, len, "send")?, bytes_mut(recv, total, "recv")?)?)
    })
}

/// Block `j` of `send` (`block` bytes each) to rank `j`; block `j` of `recv` from rank `j`.
#[no_mangle]
pub extern "C" fn rw_group_alltoall(g: *mut RwGroup, send: *const u8, block: usize, recv: *mut u8) -> RwStatus {
    guard(|| {
        let g = group(g)?;
        let total = block.checked_mul(g.size()).ok_or_else(|| Fail::Arg("block too large".into()))?;
        Ok(g.alltoall(bytes(send, total, "send")?, bytes_mut(recv, total, "recv")?)?)
    })
}

fn reduce_op(op: RwReduceOp) -> ReduceOp {
    match op {
        RwReduceOp::Sum => ReduceOp::Sum,
        RwReduceOp::Min => ReduceOp::Min,
        RwReduceOp::Max => ReduceOp::Max,
        RwReduceOp::Product => ReduceOp::Prod,
    }
}

macro_rules! allreduce {
    ($name:ident, $t:ty, $doc:literal) => {
        #[doc = $doc]
        #[no_mangle]
        pub extern "C" fn $name(g: *mut RwGroup, data: *mut $t, n: usize, op: RwReduceOp) -> RwStatus {
            guard(|| {
                let g = group(g)?;
                let v: &mut [$t] = if n == 0 {
                    &mut []
                } else if data.is_null() {
                    return Err(arg("data"));
                } else {
                    // SAFETY: non-null, aligned for the type (the caller's array), `n` long,
                    // not used by anyone else during the call.
                    unsafe { std::slice::from_raw_parts_mut(data, n) }
                };
                Ok(g.allreduce(v, reduce_op(op))?)
            })
        }
    };
}

allreduce!(rw_group_allreduce_u64, u64, "Reduce `n` u64 values over the ranks, the result at every rank.");
allreduce!(rw_group_allreduce_i64, i64, "Reduce `n` i64 values over the ranks, the result at every rank.");
allreduce!(rw_group_allreduce_u32, u32, "Reduce `n` u32 values over the ranks, the result at every rank.");
allreduce!(rw_group_allreduce_i32, i32, "Reduce `n` i32 values over the ranks, the result at every rank.");
allreduce!(rw_group_allreduce_f64, f64, "Reduce `n` f64 values over the ranks, the result at every rank.");
allreduce!(rw_group_allreduce_f32, f32, "Reduce `n` f32 values over the ranks, the result at every rank.");

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
