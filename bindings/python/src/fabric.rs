//! The fabric, regions (with the buffer protocol), region handles, notifications, and a
//! management host to run in-process.

use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rackwire::{Cmp, FabricConfig, RevokeOutcome};

use crate::args::{access, timeout};
use crate::buffer::{export, ReadBuf};
use crate::conn::Conn;
use crate::errors::{bad, to_py};
use crate::remote::RemoteRegion;

/// How long a wait looks for what it waits for while holding the GIL, before it lets go.
const GIL_SPIN: Duration = Duration::from_micros(20);

/// A fabric node: this process's membership of a rackwire fabric.
#[pyclass(module = "rackwire", frozen)]
pub(crate) struct Fabric {
    pub(crate) inner: rackwire::Fabric,
}

#[pymethods]
impl Fabric {
    /// Join a fabric. With no arguments the environment configures it (RACKWIRE_MH,
    /// RACKWIRE_SECRET or RACKWIRE_SECRET_FILE, RACKWIRE_NAME, RACKWIRE_CONFIG); `config` is
    /// a TOML file; `mh`, `secret` and `name` override.
    #[new]
    #[pyo3(signature = (mh=None, secret=None, name=None, config=None))]
    fn new(
        py: Python<'_>,
        mh: Option<String>,
        secret: Option<String>,
        name: Option<String>,
        config: Option<std::path::PathBuf>,
    ) -> PyResult<Fabric> {
        let mut cfg = match (&config, &mh, &secret) {
            (Some(p), _, _) => FabricConfig::from_file(p).map_err(to_py)?,
            (None, Some(m), Some(s)) => FabricConfig::new(m.clone(), s.as_bytes(), name.clone().unwrap_or_default()),
            _ => FabricConfig::from_env().map_err(to_py)?,
        };
        if let Some(m) = mh {
            cfg.mh = m;
        }
        if let Some(s) = secret {
            cfg.secret = s.into_bytes();
        }
        if let Some(n) = name {
            cfg.name = n;
        }
        let f = py.allow_threads(|| rackwire::Fabric::join(cfg)).map_err(to_py)?;
        Ok(Fabric { inner: f })
    }

    /// This node's id.
    #[getter]
    fn id(&self) -> u32 {
        self.inner.id()
    }

    /// This node's name.
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// A region of `len` bytes that peers may be granted at most `access` to ("r", "w",
    /// "a", combined: "rwa"). With `served`, this node serves it: no peer maps it, so a grant
    /// holds exactly as named over shared memory too (a "w" grant cannot read), at a round
    /// trip through this node per operation.
    #[pyo3(signature = (len, access="rw", served=false))]
    fn alloc(&self, len: u64, access: &str, served: bool) -> PyResult<Region> {
        let access = crate::args::access(access)?;
        let r = if served { self.inner.alloc_served(len, access) } else { self.inner.alloc(len, access) };
        Ok(Region { inner: r.map_err(to_py)? })
    }

    /// A connection to node `node`.
    fn connect(&self, py: Python<'_>, node: u32) -> PyResult<Conn> {
        let c = py.allow_threads(|| self.inner.connect(node)).map_err(to_py)?;
        Ok(Conn { inner: c })
    }

    /// The handle of the region published under `name`.
    fn lookup(&self, py: Python<'_>, name: &str) -> PyResult<RemoteRegion> {
        py.allow_threads(|| self.inner.lookup(name)).map(|h| RemoteRegion { inner: h }).map_err(to_py)
    }

    /// The next message from any peer as (sender, bytes), waiting at most `timeout` seconds.
    #[pyo3(signature = (timeout=None))]
    fn recv<'py>(&self, py: Python<'py>, timeout: Option<f64>) -> PyResult<(u32, Bound<'py, PyBytes>)> {
        let t = self::timeout(timeout)?;
        let m = py.allow_threads(|| self.inner.recv_timeout(t)).map_err(to_py)?;
        Ok((m.from, PyBytes::new(py, &m.data)))
    }

    /// The next notification, waiting at most `timeout` seconds.
    #[pyo3(signature = (timeout=None))]
    fn wait_notification(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Notification> {
        let t = self::timeout(timeout)?;
        // One already waiting, or coming within `GIL_SPIN` (a peer's answer in a ping-pong), is
        // taken without letting go of the GIL: letting it go and taking it back costs more
        // than such an answer takes to come. Both parts are the fabric's own wait (which
        // keeps its view of the peers between looks).
        let first = GIL_SPIN.min(t);
        let n = match self.inner.wait_notification(first) {
            Err(rackwire::Error::Timeout) if t > first => {
                py.allow_threads(|| self.inner.wait_notification(t - first)).map_err(to_py)?
            }
            got => got.map_err(to_py)?,
        };
        Ok(Notification { from_node: n.from, region: n.region, offset: n.offset, len: n.len, imm: n.imm })
    }

    fn __repr__(&self) -> String {
        format!("Fabric(id={}, name={:?})", self.inner.id(), self.inner.name())
    }
}

/// A region of this node's memory. `memoryview(region)` and `numpy.frombuffer(region,
/// dtype)` see its memory without a copy; peers granted it may write it at any time.
#[pyclass(module = "rackwire", frozen)]
pub(crate) struct Region {
    pub(crate) inner: rackwire::Region,
}

#[pymethods]
impl Region {
    /// Its length in bytes.
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    /// Its id at this node.
    #[getter]
    fn id(&self) -> u32 {
        self.inner.id()
    }

    /// Its handle, to give to peers.
    #[getter]
    fn handle(&self) -> RemoteRegion {
        RemoteRegion { inner: self.inner.handle() }
    }

    /// Grant node `node` `access` ("r", "w", "a", combined).
    #[pyo3(signature = (node, access="rw"))]
    fn grant(&self, node: u32, access: &str) -> PyResult<()> {
        self.inner.grant(node, self::access(access)?).map_err(to_py)
    }

    /// Revoke node `node`'s grant; returns once it can no longer reach the region, saying
    /// how: "not_mapped", "unmapped" or "cut_off".
    fn revoke(&self, py: Python<'_>, node: u32) -> PyResult<&'static str> {
        let o = py.allow_threads(|| self.inner.revoke(node)).map_err(to_py)?;
        Ok(match o {
            RevokeOutcome::NotMapped => "not_mapped",
            RevokeOutcome::Unmapped => "unmapped",
            RevokeOutcome::CutOff => "cut_off",
        })
    }

    /// Publish the region under `name` at the management host.
    fn publish(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.allow_threads(|| self.inner.publish(name)).map_err(to_py)
    }

    /// Withdraw the name.
    fn unpublish(&self, py: Python<'_>, name: &str) -> PyResult<()> {
        py.allow_threads(|| self.inner.unpublish(name)).map_err(to_py)
    }

    /// `len` bytes at `offset`, copied.
    fn read<'py>(&self, py: Python<'py>, offset: u64, len: usize) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.inner.to_vec(offset, len).map_err(to_py)?;
        Ok(PyBytes::new(py, &v))
    }

    /// Copy `data` (any buffer) to `offset`.
    fn write(&self, offset: u64, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let b = ReadBuf::get(data)?;
        self.inner.write_at(offset, b.as_slice()).map_err(to_py)
    }

    /// The 64-bit word at an 8-byte aligned `offset`, read atomically.
    fn load_u64(&self, offset: u64) -> PyResult<u64> {
        self.inner.load_u64(offset).map_err(to_py)
    }

    /// Wait until the 64-bit word at `offset` compares with `value` as `cmp` ("==", "!=",
    /// ">", ">=", "<", "<=") says, and return it: the receiving end of a peer's
    /// `Conn.write_signal`. The GIL is let go while waiting; TimeoutError after `timeout`
    /// seconds.
    #[pyo3(signature = (offset, cmp, value, timeout=None))]
    fn wait_u64(&self, py: Python<'_>, offset: u64, cmp: &str, value: u64, timeout: Option<f64>) -> PyResult<u64> {
        let cmp = match cmp {
            "==" => Cmp::Eq,
            "!=" => Cmp::Ne,
            ">" => Cmp::Gt,
            ">=" => Cmp::Ge,
            "<" => Cmp::Lt,
            "<=" => Cmp::Le,
            other => return Err(bad(format!("cmp {other:?}: one of ==, !=, >, >=, <, <="))),
        };
        let t = self::timeout(timeout)?;
        py.allow_threads(|| self.inner.wait_u64(offset, cmp, value, t)).map_err(to_py)
    }

    // SAFETY (for the buffer protocol): the region's mapping stays at one address for as long
    // as the region lives, and the view holds a reference to this object.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let (ptr, len) = (slf.get().inner.as_ptr(), slf.get().inner.len() as usize);
        // SAFETY: see above; `view` is the interpreter's.
        unsafe { export(view, flags, slf.as_any(), ptr, len) }
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}

    fn __repr__(&self) -> String {
        format!("Region(id={}, len={})", self.inner.id(), self.inner.len())
    }
}

/// A peer's operation landed in one of this node's regions.
#[pyclass(module = "rackwire", frozen, get_all)]
pub(crate) struct Notification {
    /// The peer.
    from_node: u32,
    /// The region.
    region: u32,
    /// Where.
    offset: u64,
    /// How many bytes.
    len: u64,
    /// The peer's immediate.
    imm: u64,
}

#[pymethods]
impl Notification {
    fn __repr__(&self) -> String {
        format!(
            "Notification(from_node={}, region={}, offset={}, len={}, imm={})",
            self.from_node, self.region, self.offset, self.len, self.imm
        )
    }
}

/// A management host run by this process (for tests and small setups): admits nodes that
/// know `secret`, names them and their regions.
#[pyclass(module = "rackwire")]
pub(crate) struct ManagementHost {
    inner: Option<rackwire::MhHandle>,
    addr: String,
}

#[pymethods]
impl ManagementHost {
    /// Start one listening on `addr` ("127.0.0.1:0": any free port), keeping its state in
    /// the folder `state` if given.
    #[new]
    #[pyo3(signature = (secret, addr="127.0.0.1:0", state=None))]
    fn new(py: Python<'_>, secret: &str, addr: &str, state: Option<std::path::PathBuf>) -> PyResult<ManagementHost> {
        let h = py
            .allow_threads(|| rackwire::ManagementHost::start(addr, state.as_deref(), secret.as_bytes()))
            .map_err(|e| crate::errors::ManagementHostError::new_err(e.to_string()))?;
        Ok(ManagementHost { addr: h.addr().to_string(), inner: Some(h) })
    }

    /// Its address, host:port.
    #[getter]
    fn addr(&self) -> String {
        self.addr.clone()
    }

    /// Stop it.
    fn stop(&mut self, py: Python<'_>) {
        if let Some(h) = self.inner.take() {
            py.allow_threads(|| h.stop());
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Fabric>()?;
    m.add_class::<Region>()?;
    m.add_class::<RemoteRegion>()?;
    m.add_class::<Notification>()?;
    m.add_class::<ManagementHost>()?;
    Ok(())
}
