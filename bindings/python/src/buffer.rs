//! Any Python object that exports a buffer (bytes, bytearray, memoryview, numpy arrays, a
//! region) as contiguous bytes, without a copy.

use std::ffi::c_void;

use pyo3::ffi;
use pyo3::prelude::*;

use pyo3::types::PyBytes;

use crate::errors::bad;

/// The bytes of any object that exports a buffer, to read: a `bytes` object's own (no buffer
/// export, no allocation: small writes from `bytes` are the common case), else the exported
/// buffer, held until dropped.
pub(crate) enum ReadBuf<'py> {
    Bytes(Bound<'py, PyBytes>),
    Held(RawBuffer),
}

impl<'py> ReadBuf<'py> {
    pub(crate) fn get(obj: &Bound<'py, PyAny>) -> PyResult<ReadBuf<'py>> {
        match obj.downcast_exact::<PyBytes>() {
            Ok(b) => Ok(ReadBuf::Bytes(b.clone())),
            Err(_) => Ok(ReadBuf::Held(RawBuffer::get(obj, false)?)),
        }
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Its bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            ReadBuf::Bytes(b) => b.as_bytes(),
            ReadBuf::Held(h) => h.as_slice(),
        }
    }

    /// Where its bytes lie, as addresses.
    pub(crate) fn span(&self) -> std::ops::Range<usize> {
        let s = self.as_slice();
        let at = s.as_ptr() as usize;
        at..at + s.len()
    }
}

/// Refuse a `send` buffer that shares memory with the `recv` buffer a call writes (Python lets
/// one object be both, or two views of one): the call would read what it is overwriting.
pub(crate) fn apart(send: Option<&ReadBuf<'_>>, recv: Option<&RawBuffer>) -> PyResult<()> {
    if let (Some(s), Some(r)) = (send, recv) {
        let (s, r) = (s.span(), r.span());
        if !s.is_empty() && !r.is_empty() && s.start < r.end && r.start < s.end {
            return Err(bad("send and recv share memory: give the call separate buffers"));
        }
    }
    Ok(())
}

/// A buffer held from a Python object, released when dropped. It is made with the GIL held
/// and cannot leave the thread (its raw pointers make it neither Send nor Sync), so it is also
/// dropped with the GIL held: code that lets go of the GIL borrows its bytes, never it.
pub(crate) struct RawBuffer {
    view: Box<ffi::Py_buffer>,
}

impl RawBuffer {
    /// Hold `obj`'s buffer as contiguous bytes, writable if `writable`.
    pub(crate) fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<RawBuffer> {
        // The simplest request (no format, shape or strides to fill in): an exporter that
        // cannot give its memory as one contiguous run of bytes refuses it.
        Self::get_with(obj, if writable { ffi::PyBUF_WRITABLE } else { ffi::PyBUF_SIMPLE }, writable)
    }

    /// Hold `obj`'s buffer as contiguous, writable elements, with their format.
    pub(crate) fn get_typed(obj: &Bound<'_, PyAny>) -> PyResult<RawBuffer> {
        Self::get_with(obj, ffi::PyBUF_C_CONTIGUOUS | ffi::PyBUF_FORMAT | ffi::PyBUF_WRITABLE, true)
    }

    fn get_with(obj: &Bound<'_, PyAny>, flags: std::os::raw::c_int, writable: bool) -> PyResult<RawBuffer> {
        // SAFETY: a zeroed Py_buffer is the documented "empty" state before PyObject_GetBuffer
        // fills it.
        let mut view: Box<ffi::Py_buffer> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: `obj` is a live object (we hold the GIL through `obj`'s Python token) and
        // `view` points at writable storage for one Py_buffer.
        let r = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) };
        if r != 0 {
            return Err(PyErr::take(obj.py()).unwrap_or_else(|| {
                bad(if writable { "expected a writable, contiguous buffer" } else { "expected a contiguous buffer" })
            }));
        }
        Ok(RawBuffer { view })
    }

    /// Its length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.view.len.max(0) as usize
    }

    /// Where its bytes lie, as addresses (for telling whether two buffers share memory).
    pub(crate) fn span(&self) -> std::ops::Range<usize> {
        let at = self.view.buf as usize;
        at..at + self.len()
    }

    /// Its bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: PyObject_GetBuffer filled `buf` with `len` contiguous bytes that stay valid
        // while the buffer is held (until drop).
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.len()) }
    }

    /// Its bytes, writable (only for a buffer taken with `writable`).
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len() == 0 {
            return &mut [];
        }
        // SAFETY: as `as_slice`, and the exporter granted PyBUF_WRITABLE; `&mut self` keeps
        // this the only slice handed out.
        unsafe { std::slice::from_raw_parts_mut(self.view.buf as *mut u8, self.len()) }
    }

    /// The buffer's element format (`struct` module syntax; "B" when the exporter gives none).
    pub(crate) fn format(&self) -> String {
        if self.view.format.is_null() {
            return "B".into();
        }
        // SAFETY: a non-null format is a NUL-terminated string the exporter owns while the
        // buffer is held.
        unsafe { std::ffi::CStr::from_ptr(self.view.format) }.to_string_lossy().into_owned()
    }

    /// Its bytes as elements of `T`, if they are aligned for it.
    pub(crate) fn as_mut_elements<T: Copy>(&mut self) -> PyResult<&mut [T]> {
        let len = self.len();
        let ptr = self.view.buf;
        if !len.is_multiple_of(std::mem::size_of::<T>()) || !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(bad("the array's memory is not aligned for its element type"));
        }
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: writable contiguous memory of `len` bytes, aligned for `T` (checked), held
        // for the life of `&mut self`; T is a plain number type every bit pattern is valid for.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr as *mut T, len / std::mem::size_of::<T>()) })
    }
}

impl Drop for RawBuffer {
    fn drop(&mut self) {
        // SAFETY: a buffer PyObject_GetBuffer filled, released once, with the GIL held (see
        // the type's documentation).
        unsafe { ffi::PyBuffer_Release(&mut *self.view) };
    }
}

/// Fill `view` to export `len` bytes at `ptr`, writable, owned by `owner`.
///
/// # Safety
/// `view` is the Py_buffer the interpreter passed to `__getbuffer__`; `ptr` stays valid for
/// `len` bytes while `owner` lives (the view holds a reference to it).
pub(crate) unsafe fn export(
    view: *mut ffi::Py_buffer,
    flags: std::os::raw::c_int,
    owner: &Bound<'_, PyAny>,
    ptr: *mut u8,
    len: usize,
) -> PyResult<()> {
    if view.is_null() {
        return Err(pyo3::exceptions::PyBufferError::new_err("no view to fill"));
    }
    // SAFETY: the caller's contract: `view` is the interpreter's, ours to fill.
    unsafe {
        (*view).obj = owner.clone().into_ptr();
        (*view).buf = ptr as *mut c_void;
        (*view).len = len as isize;
        (*view).readonly = 0;
        (*view).itemsize = 1;
        (*view).format =
            if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT { c"B".as_ptr() as *mut _ } else { std::ptr::null_mut() };
        (*view).ndim = 1;
        (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND { &mut (*view).len } else { std::ptr::null_mut() };
        (*view).strides =
            if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES { &mut (*view).itemsize } else { std::ptr::null_mut() };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
    }
    Ok(())
}
