//! Pointers from C: checked for null, then taken as the header's contract says they are.

use std::ffi::{c_char, CStr};

use rackwire::{Access, OpFlags, RemoteRegion};

use crate::status::{arg, Fail};
use crate::types::{RwOpFlags, RwRemoteRegion, RW_ACCESS_ATOMIC, RW_ACCESS_READ, RW_ACCESS_WRITE};

/// The object behind a handle.
#[inline]
pub(crate) fn obj<'a, T>(p: *const T, what: &str) -> Result<&'a T, Fail> {
    // SAFETY: a non-null handle is one this library handed out (a Box it leaked) and the
    // caller has not freed yet, as the header's contract says.
    unsafe { p.as_ref() }.ok_or_else(|| arg(what))
}

/// Store `v` where `out` points.
#[inline]
pub(crate) fn put<T>(out: *mut T, v: T, what: &str) -> Result<(), Fail> {
    if out.is_null() {
        return Err(arg(what));
    }
    // SAFETY: non-null, and the caller passes a pointer to writable storage for one `T`.
    unsafe { out.write(v) };
    Ok(())
}

/// The bytes at `p`, `len` long.
#[inline]
pub(crate) fn bytes<'a>(p: *const u8, len: usize, what: &str) -> Result<&'a [u8], Fail> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(arg(what));
    }
    // SAFETY: non-null, and the caller passes `len` readable bytes that stay put for the call.
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// The writable bytes at `p`, `len` long.
pub(crate) fn bytes_mut<'a>(p: *mut u8, len: usize, what: &str) -> Result<&'a mut [u8], Fail> {
    if len == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(arg(what));
    }
    // SAFETY: non-null, and the caller passes `len` writable bytes no one else uses meanwhile.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
}

pub(crate) fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(arg(what));
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| Fail::Arg(format!("{what} is not UTF-8")))
}

#[inline]
pub(crate) fn remote(h: *const RwRemoteRegion) -> Result<RemoteRegion, Fail> {
    Ok(RemoteRegion::from_bytes(&obj(h, "region handle")?.bytes)?)
}

/// A switch from C: 0 or 1 (a C `bool` is one of those; any other byte is refused, never
/// read as a Rust `bool`, for which it would be undefined).
#[inline]
pub(crate) fn switch(v: u8, what: &str) -> Result<bool, Fail> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(Fail::Arg(format!("{what} is {v}: 0 or 1"))),
    }
}

#[inline]
pub(crate) fn flags(f: RwOpFlags) -> Result<OpFlags, Fail> {
    let mut o = OpFlags::NONE;
    if switch(f.notify, "RwOpFlags.notify")? {
        o = o.notify(f.imm);
    }
    if switch(f.fence_before, "RwOpFlags.fence_before")? {
        o = o.fence_before();
    }
    if switch(f.fence_after, "RwOpFlags.fence_after")? {
        o = o.fence_after();
    }
    Ok(o)
}

pub(crate) fn access(bits: u32) -> Result<Access, Fail> {
    if bits & !(RW_ACCESS_READ | RW_ACCESS_WRITE | RW_ACCESS_ATOMIC) != 0 {
        return Err(Fail::Arg(format!("access bits {bits:#x}: only RW_ACCESS_READ, _WRITE and _ATOMIC")));
    }
    let mut a = Access::NONE;
    if bits & RW_ACCESS_READ != 0 {
        a = a | Access::READ;
    }
    if bits & RW_ACCESS_WRITE != 0 {
        a = a | Access::WRITE;
    }
    if bits & RW_ACCESS_ATOMIC != 0 {
        a = a | Access::ATOMIC;
    }
    Ok(a)
}

pub(crate) fn boxed<T>(out: *mut *mut T, v: T, what: &str) -> Result<(), Fail> {
    if out.is_null() {
        return Err(arg(what));
    }
    put(out, Box::into_raw(Box::new(v)), what)
}

pub(crate) fn free<T>(p: *mut T) {
    if !p.is_null() {
        // SAFETY: a handle this library handed out with `boxed`, freed once (the contract).
        drop(unsafe { Box::from_raw(p) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the switches of `RwOpFlags` from C (issue: they were Rust `bool`s, and a byte
    // other than 0 or 1 there is undefined behaviour): 0 and 1 are off and on, and any other
    // value is refused with the field named (the call then returns RW_STATUS_BAD_ARGUMENT).
    #[test]
    fn op_flag_switches_are_zero_or_one() {
        let on = RwOpFlags { notify: 1, imm: 9, fence_before: 1, fence_after: 0 };
        let f = flags(on).unwrap_or_else(|_| panic!("0 and 1 are switches"));
        assert_eq!(f, OpFlags::NONE.notify(9).fence_before());
        for (i, bad) in
            [RwOpFlags { notify: 2, ..on }, RwOpFlags { fence_before: 255, ..on }, RwOpFlags { fence_after: 7, ..on }]
                .into_iter()
                .enumerate()
        {
            match flags(bad) {
                Err(Fail::Arg(m)) => assert!(m.contains("RwOpFlags.") && m.contains("0 or 1"), "{m}"),
                _ => panic!("case {i}: a switch of more than 1 was taken"),
            }
        }
    }
}
