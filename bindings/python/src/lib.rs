//! rackwire's Python bindings (module `rackwire._rackwire`, re-exported by the `rackwire`
//! package): the fabric, regions (the buffer protocol: `memoryview(region)` and
//! `numpy.frombuffer(region, ...)` see the region's memory without a copy), region handles,
//! connections and their one-sided operations, messages, notifications, groups and their
//! collectives. Every wait releases the GIL. Every error kind of the Rust API is its own
//! exception class under `rackwire.RackwireError`.

// Python objects reach Rust through raw buffers (the buffer protocol): unsafe is allowed in
// this crate, each use with its reason.
#![allow(unsafe_code)]
#![warn(missing_docs)]

mod args;
mod buffer;
mod conn;
mod errors;
mod fabric;
mod group;
mod remote;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _rackwire(m: &Bound<'_, PyModule>) -> PyResult<()> {
    fabric::register(m)?;
    conn::register(m)?;
    group::register(m)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
