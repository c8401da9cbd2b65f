//! Connections, their one-sided operations, and operation handles.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rackwire::{Completion, OpFlags, Signal};

use crate::args::timeout;
use crate::buffer::ReadBuf;
use crate::errors::{bad, to_py};
use crate::remote::RemoteRegion;

/// A connection to a peer.
#[pyclass(module = "rackwire", frozen)]
pub(crate) struct Conn {
    pub(crate) inner: rackwire::Conn,
}

fn flags(notify: Option<u64>, fence_before: bool, fence_after: bool) -> OpFlags {
    let mut f = OpFlags::NONE;
    if let Some(imm) = notify {
        f = f.notify(imm);
    }
    if fence_before {
        f = f.fence_before();
    }
    if fence_after {
        f = f.fence_after();
    }
    f
}

/// Wait for `o`, letting go of the GIL only if it has not finished already (over shared
/// memory it usually has).
fn wait_op(py: Python<'_>, mut o: rackwire::Op) -> Result<Completion, rackwire::Error> {
    match o.poll() {
        Some(r) => r,
        None => py.allow_threads(move || o.wait()),
    }
}

impl Conn {
    /// Start writing `data` at `offset` of `target`. Submitting does not wait (the bytes are
    /// taken before it returns; over shared memory the write is done by then): the GIL stays
    /// held.
    fn submit_write(
        &self,
        target: &RemoteRegion,
        offset: u64,
        data: &Bound<'_, PyAny>,
        f: OpFlags,
    ) -> PyResult<rackwire::Op> {
        let buf = ReadBuf::get(data)?;
        Ok(self.inner.write(&target.inner, offset, buf.as_slice(), f))
    }
}

fn op(o: rackwire::Op) -> Op {
    Op { state: Mutex::new(State::Running(Some(o))) }
}

#[pymethods]
impl Conn {
    /// The peer's node id.
    #[getter]
    fn peer(&self) -> u32 {
        self.inner.peer()
    }

    /// The transport: "shm" or "edge".
    #[getter]
    fn transport(&self) -> &'static str {
        self.inner.transport()
    }

    /// Write `data` (any buffer: bytes, bytearray, memoryview, a numpy array, a region) at
    /// `offset` of `target`. The bytes are taken before the call returns, straight from the
    /// buffer (no copy in between); the returned Op says when they are in place. `notify`:
    /// the immediate to notify the target with.
    #[pyo3(signature = (target, offset, data, notify=None, fence_before=false, fence_after=false))]
    fn write(
        &self,
        target: &RemoteRegion,
        offset: u64,
        data: &Bound<'_, PyAny>,
        notify: Option<u64>,
        fence_before: bool,
        fence_after: bool,
    ) -> PyResult<Op> {
        Ok(op(self.submit_write(target, offset, data, flags(notify, fence_before, fence_after))?))
    }

    /// Write `data` (any buffer) at `offset` of `target`, then update the 64-bit signal word
    /// at `signal_offset`: store `value`, or with `add` add it atomically. The peer waits for
    /// the word with `Region.wait_u64` and finds the data in place when it changes.
    #[pyo3(signature = (target, offset, data, signal_offset, value, add=false, notify=None))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn write_signal(
        &self,
        target: &RemoteRegion,
        offset: u64,
        data: &Bound<'_, PyAny>,
        signal_offset: u64,
        value: u64,
        add: bool,
        notify: Option<u64>,
    ) -> PyResult<Op> {
        let buf = ReadBuf::get(data)?;
        let signal = if add { Signal::add(signal_offset, value) } else { Signal::set(signal_offset, value) };
        let f = flags(notify, false, false);
        Ok(op(self.inner.write_signal(&target.inner, offset, buf.as_slice(), signal, f)))
    }

    /// `write` and its wait in one call: returns once the bytes are in place (raises the
    /// operation's error), with no Op to keep; the GIL is let go only if it has to wait.
    #[pyo3(signature = (target, offset, data, notify=None, fence_before=false, fence_after=false))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, one per flag
    fn write_wait(
        &self,
        py: Python<'_>,
        target: &RemoteRegion,
        offset: u64,
        data: &Bound<'_, PyAny>,
        notify: Option<u64>,
        fence_before: bool,
        fence_after: bool,
    ) -> PyResult<()> {
        let o = self.submit_write(target, offset, data, flags(notify, fence_before, fence_after))?;
        wait_op(py, o).map(drop).map_err(to_py)
    }

    /// Put one 64-bit integer (`value`, little-endian) at `offset` of `target` and wait until
    /// it is in place, as OpenSHMEM's `shmem_uint64_p`: a word needs no buffer built for it.
    /// `notify`: the immediate to notify the target with. An 8-byte aligned word is placed in
    /// one store.
    #[pyo3(signature = (target, offset, value, notify=None))]
    fn put_u64(
        &self,
        py: Python<'_>,
        target: &RemoteRegion,
        offset: u64,
        value: u64,
        notify: Option<u64>,
    ) -> PyResult<()> {
        let o = self.inner.write(&target.inner, offset, &value.to_le_bytes(), flags(notify, false, false));
        wait_op(py, o).map(drop).map_err(to_py)
    }

    /// Write several (offset, data) pieces into `target`, all or nothing; the notification,
    /// if any, once all are in place.
    #[pyo3(signature = (target, pieces, notify=None))]
    fn write_batch(
        &self,
        target: &RemoteRegion,
        pieces: Vec<(u64, Bound<'_, PyAny>)>,
        notify: Option<u64>,
    ) -> PyResult<Op> {
        let bufs: Vec<(u64, ReadBuf<'_>)> =
            pieces.iter().map(|(o, d)| Ok((*o, ReadBuf::get(d)?))).collect::<PyResult<_>>()?;
        let entries: Vec<(u64, &[u8])> = bufs.iter().map(|(o, b)| (*o, b.as_slice())).collect();
        let f = flags(notify, false, false);
        Ok(op(self.inner.write_batch(&target.inner, &entries, f)))
    }

    /// Read `len` bytes at `offset` of `target`; the Op's result is the bytes.
    #[pyo3(signature = (target, offset, len, notify=None))]
    fn read(&self, target: &RemoteRegion, offset: u64, len: u64, notify: Option<u64>) -> Op {
        op(self.inner.read(&target.inner, offset, len, flags(notify, false, false)))
    }

    /// Compare-and-swap the 8-byte word at `offset`; the Op's result is the old value.
    #[pyo3(signature = (target, offset, expected, new, notify=None))]
    fn compare_swap(
        &self,
        py: Python<'_>,
        target: &RemoteRegion,
        offset: u64,
        expected: u64,
        new: u64,
        notify: Option<u64>,
    ) -> Op {
        op(py.allow_threads(|| {
            self.inner.compare_swap(&target.inner, offset, expected, new, flags(notify, false, false))
        }))
    }

    /// Fetch-and-add on the 8-byte word at `offset`; the Op's result is the old value.
    #[pyo3(signature = (target, offset, add, notify=None))]
    fn fetch_add(&self, target: &RemoteRegion, offset: u64, add: u64, notify: Option<u64>) -> Op {
        op(self.inner.fetch_add(&target.inner, offset, add, flags(notify, false, false)))
    }

    /// Send a message (any buffer) to the peer and wait until it is placed.
    fn send(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let buf = ReadBuf::get(data)?;
        let data = buf.as_slice();
        py.allow_threads(|| self.inner.send(data).wait()).map(drop).map_err(to_py)
    }

    /// Send a datagram (any buffer): delivered at most once, as a message, or not at all, with
    /// nothing to wait for. Too large for one edge frame: MessageTooLargeError; the queue or
    /// the peer's ring full: LimitError (nothing sent either way).
    fn send_datagram(&self, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let buf = ReadBuf::get(data)?;
        self.inner.send_datagram(buf.as_slice()).map_err(to_py)
    }

    /// The next message from the peer, waiting at most `timeout` seconds.
    #[pyo3(signature = (timeout=None))]
    fn recv<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<Bound<'py, PyBytes>> {
        let t = self::timeout(timeout)?;
        let m = py.allow_threads(|| self.inner.recv_timeout(t)).map_err(to_py)?;
        Ok(PyBytes::new(py, &m))
    }

    /// The connection's counters: every transport's (`writes`, `reads`, `atomics`, their
    /// bytes, `messages_sent`, `notifications_sent`, `refused`) and its own transport's
    /// (shared memory's ring waits, doorbells and mappings; the edge transport's frames,
    /// losses, sealing and datagrams), by name.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        let serde_json::Value::Object(fields) =
            serde_json::to_value(self.inner.stats()).map_err(|e| bad(e.to_string()))?
        else {
            return Ok(d);
        };
        for (k, v) in fields {
            match v {
                serde_json::Value::Bool(b) => d.set_item(k, b)?,
                serde_json::Value::Number(n) => d.set_item(k, n.as_u64().unwrap_or(0))?,
                _ => {}
            }
        }
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("Conn(peer={}, transport={:?})", self.inner.peer(), self.inner.transport())
    }
}

enum State {
    Running(Option<rackwire::Op>),
    Done(Result<Completion, rackwire::Error>),
}

impl State {
    /// Keep the operation's outcome if it finished.
    fn settle(&mut self) {
        if let State::Running(Some(o)) = self {
            if let Some(r) = o.poll() {
                *self = State::Done(r);
            }
        }
    }
}

/// An operation in flight, then its outcome.
#[pyclass(module = "rackwire", frozen)]
pub(crate) struct Op {
    state: Mutex<State>,
}

fn result(py: Python<'_>, r: &Result<Completion, rackwire::Error>) -> PyResult<PyObject> {
    match r {
        Ok(Completion::Done) => Ok(py.None()),
        Ok(Completion::Data(d)) => Ok(PyBytes::new(py, d).into_any().unbind()),
        Ok(Completion::Value(v)) => Ok(v.into_pyobject(py)?.into_any().unbind()),
        Err(e) => Err(to_py(e.clone())),
    }
}

#[pymethods]
impl Op {
    /// True once the operation finished (in place, or failed).
    fn done(&self) -> PyResult<bool> {
        let mut st = self.state.lock().map_err(|_| bad("operation handle poisoned"))?;
        st.settle();
        Ok(matches!(*st, State::Done(_)))
    }

    /// Wait for the operation (at most `timeout` seconds, else the fabric's operation
    /// timeout) and return its result: None for a write, the bytes of a read, the old value
    /// of an atomic. Raises the operation's error.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyObject> {
        let t = timeout.map(|s| crate::args::timeout(Some(s))).transpose()?;
        // The operation is taken out of the handle to be waited for, and the handle's lock let
        // go before the GIL is: another thread's `done()` (which takes the lock with the GIL
        // held) must not wait on a thread that waits for the GIL.
        let mut o = {
            let mut st = self.state.lock().map_err(|_| bad("operation handle poisoned"))?;
            // Finished already (over shared memory, usually): no need to let go of the GIL.
            st.settle();
            match &mut *st {
                State::Done(r) => return result(py, r),
                State::Running(slot) => {
                    slot.take().ok_or_else(|| bad("another thread is waiting for this operation"))?
                }
            }
        };
        let r = match t {
            None => py.allow_threads(move || o.wait()),
            Some(t) => {
                let r = py.allow_threads(|| o.wait_timeout(t));
                if matches!(r, Err(rackwire::Error::Timeout)) && !o.is_done() {
                    // Still running: keep it, so a later wait can take it.
                    *self.state.lock().map_err(|_| bad("operation handle poisoned"))? = State::Running(Some(o));
                    return Err(to_py(rackwire::Error::Timeout));
                }
                r
            }
        };
        let mut st = self.state.lock().map_err(|_| bad("operation handle poisoned"))?;
        *st = State::Done(r);
        match &*st {
            State::Done(r) => result(py, r),
            State::Running(_) => Err(bad("operation still running")),
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Conn>()?;
    m.add_class::<Op>()?;
    Ok(())
}
