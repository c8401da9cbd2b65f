//! Groups of ranks and their collectives, on any buffer (numpy arrays included).

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rackwire_coll::ReduceOp;

use crate::buffer::{RawBuffer, ReadBuf};
use crate::errors::{bad, coll_to_py};

/// N processes that are ranks 0..N-1 of one job. `Group()` finds its place from the
/// environment (rackwire launch, mpirun, srun, ...). Used by one thread at a time.
#[pyclass(module = "rackwire", unsendable)]
pub(crate) struct Group {
    inner: Option<rackwire_coll::Group>,
}

impl Group {
    fn g(&mut self) -> PyResult<&mut rackwire_coll::Group> {
        self.inner.as_mut().ok_or_else(|| bad("the group was left"))
    }
}

fn reduce_op(op: &str) -> PyResult<ReduceOp> {
    op.parse::<ReduceOp>().map_err(|e| bad(format!("reduction {op:?}: {e}")))
}

#[pymethods]
impl Group {
    /// Join the job the environment describes.
    #[new]
    fn new(py: Python<'_>) -> PyResult<Group> {
        let g = py.allow_threads(rackwire_coll::Group::from_env).map_err(coll_to_py)?;
        Ok(Group { inner: Some(g) })
    }

    /// This process's rank.
    #[getter]
    fn rank(&mut self) -> PyResult<usize> {
        Ok(self.g()?.rank())
    }

    /// The number of ranks.
    #[getter]
    fn size(&mut self) -> PyResult<usize> {
        Ok(self.g()?.size())
    }

    /// Wait until every rank is here.
    fn barrier(&mut self) -> PyResult<()> {
        self.g()?.barrier().map_err(coll_to_py)
    }

    /// Rank `root`'s contents of `buf` (any writable buffer, e.g. a numpy array) into every
    /// rank's `buf`, in place.
    fn bcast(&mut self, root: usize, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut b = RawBuffer::get(buf, true)?;
        self.g()?.bcast(root, b.as_mut_slice()).map_err(coll_to_py)
    }

    /// Reduce `array` (a writable numpy array or buffer of u32, u64, i32, i64, f32 or f64)
    /// over the ranks with `op` ("sum", "min", "max", "prod"), the result in place at every
    /// rank.
    #[pyo3(signature = (array, op="sum"))]
    fn allreduce(&mut self, array: &Bound<'_, PyAny>, op: &str) -> PyResult<()> {
        let op = reduce_op(op)?;
        let mut b = RawBuffer::get_typed(array)?;
        let fmt = b.format();
        // The element type from the buffer's format ("<d", "=f", "L", ...), as `struct` writes it.
        let code = fmt.trim_start_matches(['@', '=', '<', '>', '!']);
        let g = self.inner.as_mut().ok_or_else(|| bad("the group was left"))?;
        let size = |c: char| match c {
            'i' | 'I' | 'f' => 4,
            'l' | 'L' => std::mem::size_of::<std::os::raw::c_long>(),
            _ => 8,
        };
        match code {
            "d" => g.allreduce(b.as_mut_elements::<f64>()?, op),
            "f" => g.allreduce(b.as_mut_elements::<f32>()?, op),
            "q" => g.allreduce(b.as_mut_elements::<i64>()?, op),
            "Q" => g.allreduce(b.as_mut_elements::<u64>()?, op),
            "i" => g.allreduce(b.as_mut_elements::<i32>()?, op),
            "I" => g.allreduce(b.as_mut_elements::<u32>()?, op),
            "l" if size('l') == 8 => g.allreduce(b.as_mut_elements::<i64>()?, op),
            "L" if size('L') == 8 => g.allreduce(b.as_mut_elements::<u64>()?, op),
            other => return Err(bad(format!("allreduce of elements {other:?}: u32, u64, i32, i64, f32 or f64"))),
        }
        .map_err(coll_to_py)
    }

    /// Every rank's `data` (the same length at every rank), by rank, as one bytes object.
    fn allgather<'py>(&mut self, py: Python<'py>, data: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let b = ReadBuf::get(data)?;
        let g = self.g()?;
        let mut out = vec![0u8; b.len() * g.size()];
        g.allgather(b.as_slice(), &mut out).map_err(coll_to_py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Block j of `send` (size divided by the ranks) to rank j; block j of the result from
    /// rank j.
    fn alltoall<'py>(&mut self, py: Python<'py>, send: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let b = ReadBuf::get(send)?;
        let g = self.g()?;
        if b.len() % g.size() != 0 {
            return Err(bad(format!("{} bytes do not split into {} blocks", b.len(), g.size())));
        }
        let mut out = vec![0u8; b.len()];
        g.alltoall(b.as_slice(), &mut out).map_err(coll_to_py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Leave the group together with the other ranks.
    fn leave(&mut self) -> PyResult<()> {
        match self.inner.take() {
            Some(g) => g.leave().map_err(coll_to_py),
            None => Ok(()),
        }
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(&mut self, _t: PyObject, _v: PyObject, _tb: PyObject) -> PyResult<bool> {
        self.leave()?;
        Ok(false)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Group>()
}
