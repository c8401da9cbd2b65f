//! Handles to peers' regions, as Python holds them: to bytes or text to send or store, and back.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::buffer::ReadBuf;
use crate::errors::to_py;

/// A handle to a peer's region: `bytes(h)` and `str(h)` give it to send or store;
/// `RemoteRegion.from_bytes` and `RemoteRegion.from_str` take it back (checked).
#[pyclass(module = "rackwire", frozen, eq)]
#[derive(PartialEq)]
pub(crate) struct RemoteRegion {
    pub(crate) inner: rackwire::RemoteRegion,
}

#[pymethods]
impl RemoteRegion {
    /// A handle from its bytes.
    #[staticmethod]
    fn from_bytes(b: &Bound<'_, PyAny>) -> PyResult<RemoteRegion> {
        let buf = ReadBuf::get(b)?;
        rackwire::RemoteRegion::from_bytes(buf.as_slice()).map(|h| RemoteRegion { inner: h }).map_err(to_py)
    }

    /// A handle from its text.
    #[staticmethod]
    fn from_str(s: &str) -> PyResult<RemoteRegion> {
        s.parse::<rackwire::RemoteRegion>().map(|h| RemoteRegion { inner: h }).map_err(to_py)
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.to_bytes())
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("RemoteRegion(node={}, region={}, len={})", self.inner.node(), self.inner.region(), self.inner.len())
    }

    /// The owner's node id.
    #[getter]
    fn node(&self) -> u32 {
        self.inner.node()
    }

    /// The region's id at its owner.
    #[getter]
    fn region(&self) -> u32 {
        self.inner.region()
    }

    /// The region's length.
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }
}
