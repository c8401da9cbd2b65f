//! The fabric, regions, and region handles.

use std::ffi::c_char;
use std::time::Duration;

use rackwire::{Cmp, Fabric, FabricConfig, RemoteRegion};

use crate::ptr::{access, boxed, bytes, bytes_mut, free, obj, put, remote, text};
use crate::status::{arg, guard, Fail, RwStatus};
use crate::types::*;

// ---- the fabric ----

/// Join the fabric configured by the environment (RACKWIRE_MH, RACKWIRE_SECRET_FILE or
/// RACKWIRE_SECRET, RACKWIRE_NAME, RACKWIRE_CONFIG, ...).
#[no_mangle]
pub extern "C" fn rw_fabric_join_env(out: *mut *mut RwFabric) -> RwStatus {
    guard(|| boxed(out, RwFabric(Fabric::join(FabricConfig::from_env()?)?), "out"))
}

/// Join the fabric configured by a TOML file.
#[no_mangle]
pub extern "C" fn rw_fabric_join_file(path: *const c_char, out: *mut *mut RwFabric) -> RwStatus {
    guard(|| {
        let cfg = FabricConfig::from_file(std::path::Path::new(text(path, "path")?))?;
        boxed(out, RwFabric(Fabric::join(cfg)?), "out")
    })
}

/// Leave the fabric and free the handle (regions and connections of it still held stop
/// working).
#[no_mangle]
pub extern "C" fn rw_fabric_free(f: *mut RwFabric) {
    free(f);
}

/// This node's id.
#[no_mangle]
pub extern "C" fn rw_fabric_id(f: *const RwFabric, out: *mut u32) -> RwStatus {
    guard(|| put(out, obj(f, "fabric")?.0.id(), "out"))
}

/// Wait up to `timeout_ms` for a notification.
#[no_mangle]
pub extern "C" fn rw_fabric_wait_notification(
    f: *const RwFabric,
    timeout_ms: u64,
    out: *mut RwNotification,
) -> RwStatus {
    guard(|| {
        let n = obj(f, "fabric")?.0.wait_notification(Duration::from_millis(timeout_ms))?;
        put(out, RwNotification { from: n.from, region: n.region, offset: n.offset, len: n.len, imm: n.imm }, "out")
    })
}

/// Wait up to `timeout_ms` for a message from any peer: its bytes into `buf` (`cap` bytes),
/// its length into `*out_len`, its sender into `*out_from`. A message longer than `cap` is
/// taken all the same: RW_STATUS_BAD_ARGUMENT, with its length in `*out_len`.
#[no_mangle]
pub extern "C" fn rw_fabric_recv(
    f: *const RwFabric,
    timeout_ms: u64,
    buf: *mut u8,
    cap: usize,
    out_len: *mut usize,
    out_from: *mut u32,
) -> RwStatus {
    guard(|| {
        let m = obj(f, "fabric")?.0.recv_timeout(Duration::from_millis(timeout_ms))?;
        put(out_len, m.data.len(), "out_len")?;
        put(out_from, m.from, "out_from")?;
        let dst = bytes_mut(buf, cap, "buf")?;
        if m.data.len() > cap {
            return Err(Fail::Arg(format!("a {}-byte message does not fit {cap} bytes", m.data.len())));
        }
        dst[..m.data.len()].copy_from_slice(&m.data);
        Ok(())
    })
}

/// The handle of the region published under `name`.
#[no_mangle]
pub extern "C" fn rw_lookup(f: *const RwFabric, name: *const c_char, out: *mut RwRemoteRegion) -> RwStatus {
    guard(|| {
        let h = obj(f, "fabric")?.0.lookup(text(name, "name")?)?;
        put(out, RwRemoteRegion { bytes: h.to_bytes() }, "out")
    })
}

// ---- regions ----

/// Allocate a region of `len` bytes that peers may be granted at most `access` to.
#[no_mangle]
pub extern "C" fn rw_region_alloc(f: *const RwFabric, len: u64, access_bits: u32, out: *mut *mut RwRegion) -> RwStatus {
    guard(|| boxed(out, RwRegion(obj(f, "fabric")?.0.alloc(len, access(access_bits)?)?), "out"))
}

/// Allocate a region of `len` bytes that this node serves: no peer ever maps it, every
/// operation on it is checked here against the peer's grant, so a write grant cannot read
/// and an atomic grant cannot store, over shared memory too (each operation costs a round
/// trip through this node).
#[no_mangle]
pub extern "C" fn rw_region_alloc_served(
    f: *const RwFabric,
    len: u64,
    access_bits: u32,
    out: *mut *mut RwRegion,
) -> RwStatus {
    guard(|| boxed(out, RwRegion(obj(f, "fabric")?.0.alloc_served(len, access(access_bits)?)?), "out"))
}

/// Free a region (peers lose access).
#[no_mangle]
pub extern "C" fn rw_region_free(r: *mut RwRegion) {
    free(r);
}

/// The region's memory in this process, for zero-copy use: `*out_len` bytes from `*out_ptr`,
/// valid until the region is freed. Granted peers may write it at any time.
#[no_mangle]
pub extern "C" fn rw_region_ptr(r: *const RwRegion, out_ptr: *mut *mut u8, out_len: *mut usize) -> RwStatus {
    guard(|| {
        let r = &obj(r, "region")?.0;
        put(out_ptr, r.as_ptr(), "out_ptr")?;
        put(out_len, r.len() as usize, "out_len")
    })
}

/// Wait up to `timeout_ms` until the 64-bit word at the 8-byte aligned `offset` of the
/// region compares with `value` as `cmp` (one of `RW_CMP_*`) says; the word into `*out`. The
/// receiving end of a peer's `rw_write_signal`. RW_STATUS_TIMEOUT when it does not.
#[no_mangle]
pub extern "C" fn rw_region_wait_u64(
    r: *const RwRegion,
    offset: u64,
    cmp: u32,
    value: u64,
    timeout_ms: u64,
    out: *mut u64,
) -> RwStatus {
    guard(|| {
        let cmp = match cmp {
            RW_CMP_EQ => Cmp::Eq,
            RW_CMP_NE => Cmp::Ne,
            RW_CMP_GT => Cmp::Gt,
            RW_CMP_GE => Cmp::Ge,
            RW_CMP_LT => Cmp::Lt,
            RW_CMP_LE => Cmp::Le,
            _ => return Err(arg("cmp")),
        };
        let word = obj(r, "region")?.0.wait_u64(offset, cmp, value, Duration::from_millis(timeout_ms))?;
        put(out, word, "out")
    })
}

/// The region's handle, to give to peers.
#[no_mangle]
pub extern "C" fn rw_region_handle(r: *const RwRegion, out: *mut RwRemoteRegion) -> RwStatus {
    guard(|| put(out, RwRemoteRegion { bytes: obj(r, "region")?.0.handle().to_bytes() }, "out"))
}

/// Grant `node` `access` to the region.
#[no_mangle]
pub extern "C" fn rw_region_grant(r: *const RwRegion, node: u32, access_bits: u32) -> RwStatus {
    guard(|| Ok(obj(r, "region")?.0.grant(node, access(access_bits)?)?))
}

/// Revoke `node`'s grant; returns once the peer can no longer reach the region.
#[no_mangle]
pub extern "C" fn rw_region_revoke(r: *const RwRegion, node: u32) -> RwStatus {
    guard(|| obj(r, "region")?.0.revoke(node).map(drop).map_err(Fail::from))
}

/// Publish the region under `name` at the management host.
#[no_mangle]
pub extern "C" fn rw_region_publish(r: *const RwRegion, name: *const c_char) -> RwStatus {
    guard(|| Ok(obj(r, "region")?.0.publish(text(name, "name")?)?))
}

/// Withdraw the name.
#[no_mangle]
pub extern "C" fn rw_region_unpublish(r: *const RwRegion, name: *const c_char) -> RwStatus {
    guard(|| Ok(obj(r, "region")?.0.unpublish(text(name, "name")?)?))
}

// ---- region handles ----

/// A handle from its bytes (checked).
#[no_mangle]
pub extern "C" fn rw_remote_from_bytes(buf: *const u8, len: usize, out: *mut RwRemoteRegion) -> RwStatus {
    guard(|| {
        let h = RemoteRegion::from_bytes(bytes(buf, len, "buf")?)?;
        put(out, RwRemoteRegion { bytes: h.to_bytes() }, "out")
    })
}

/// A handle as text (NUL-terminated, at most RW_REMOTE_REGION_TEXT_MAX bytes with the NUL).
#[no_mangle]
pub extern "C" fn rw_remote_to_text(h: *const RwRemoteRegion, buf: *mut c_char, cap: usize) -> RwStatus {
    guard(|| {
        let t = remote(h)?.to_string();
        let dst = bytes_mut(buf.cast(), cap, "buf")?;
        if t.len() + 1 > cap {
            return Err(Fail::Arg(format!("the handle's text needs {} bytes, {cap} given", t.len() + 1)));
        }
        dst[..t.len()].copy_from_slice(t.as_bytes());
        dst[t.len()] = 0;
        Ok(())
    })
}

/// A handle from its text.
#[no_mangle]
pub extern "C" fn rw_remote_from_text(s: *const c_char, out: *mut RwRemoteRegion) -> RwStatus {
    guard(|| {
        let h: RemoteRegion = text(s, "text")?.parse()?;
        put(out, RwRemoteRegion { bytes: h.to_bytes() }, "out")
    })
}

/// The node that owns the handle's region.
#[no_mangle]
pub extern "C" fn rw_remote_node(h: *const RwRemoteRegion, out: *mut u32) -> RwStatus {
    guard(|| put(out, remote(h)?.node(), "out"))
}

/// The region's length.
#[no_mangle]
pub extern "C" fn rw_remote_len(h: *const RwRemoteRegion, out: *mut u64) -> RwStatus {
    guard(|| put(out, remote(h)?.len(), "out"))
}
