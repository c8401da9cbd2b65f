//! Groups of ranks and their collectives, on any buffer (numpy arrays included).

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rackwire_coll::ReduceOp;

use crate::buffer::{apart, RawBuffer, ReadBuf};
use crate::errors::{bad, coll_to_py};

/// N processes that are ranks 0..N-1 of one job. `Group()` finds its place from the
/// environment (rackwire launch, mpirun, srun, ...). Used by one thread at a time; its calls
/// let go of the GIL while they wait for the other ranks.
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

/// Run `$call` with `$v` the elements of buffer `$b` as the type its format names ("<d",
/// "=f", "L", ... as `struct` writes them): u32, u64, i32, i64, f32 or f64.
macro_rules! typed {
    (@as $b:ident, $t:ty, $v:ident => $call:expr) => {{
        let $v = $b.as_mut_elements::<$t>()?;
        $call
    }};
    ($b:ident, $what:literal, $v:ident => $call:expr) => {{
        let fmt = $b.format();
        let code = fmt.trim_start_matches(['@', '=', '<', '>', '!']);
        // C's long is 64 bits here: the same elements as long long.
        let code = match code {
            "l" if std::mem::size_of::<std::os::raw::c_long>() == 8 => "q",
            "L" if std::mem::size_of::<std::os::raw::c_long>() == 8 => "Q",
            c => c,
        };
        match code {
            "d" => typed!(@as $b, f64, $v => $call),
            "f" => typed!(@as $b, f32, $v => $call),
            "q" => typed!(@as $b, i64, $v => $call),
            "Q" => typed!(@as $b, u64, $v => $call),
            "i" => typed!(@as $b, i32, $v => $call),
            "I" => typed!(@as $b, u32, $v => $call),
            other => return Err(bad(format!("{} of elements {other:?}: u32, u64, i32, i64, f32 or f64", $what))),
        }
    }};
}

/// A buffer the root must give (`what`), or nothing at another rank.
fn at_root<'py>(root: bool, buf: Option<&Bound<'py, PyAny>>, what: &str) -> PyResult<Option<ReadBuf<'py>>> {
    match (root, buf) {
        (true, None) => Err(bad(format!("the root gives `{what}`"))),
        (true, Some(b)) => Ok(Some(ReadBuf::get(b)?)),
        (false, _) => Ok(None),
    }
}

/// The root's writable `recv`, or nothing at another rank.
fn writable_at_root(root: bool, buf: Option<&Bound<'_, PyAny>>) -> PyResult<Option<RawBuffer>> {
    match (root, buf) {
        (true, None) => Err(bad("the root gives `recv`")),
        (true, Some(b)) => Ok(Some(RawBuffer::get(b, true)?)),
        (false, _) => Ok(None),
    }
}

/// The bytes `counts` add up to, each within a collective's block limit.
/// A new bytes object of `len` bytes that `run` fills, run without the GIL (a collective's
/// result).
fn new_bytes<'py>(
    py: Python<'py>,
    len: usize,
    run: impl FnOnce(&mut [u8]) -> Result<(), rackwire_coll::CollError> + Send,
) -> PyResult<Bound<'py, PyBytes>> {
    let mut out = vec![0u8; len];
    py.allow_threads(|| run(&mut out)).map_err(coll_to_py)?;
    Ok(PyBytes::new(py, &out))
}

fn byte_total(counts: &[usize]) -> PyResult<usize> {
    if counts.len() > rackwire_coll::RANKS_MAX {
        return Err(bad(format!("{} counts: at most {} ranks", counts.len(), rackwire_coll::RANKS_MAX)));
    }
    if let Some(c) = counts.iter().find(|&&c| c > rackwire_coll::BLOCK_BYTES_MAX) {
        return Err(bad(format!("a count of {c} bytes: at most {}", rackwire_coll::BLOCK_BYTES_MAX)));
    }
    Ok(counts.iter().sum())
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
    fn barrier(&mut self, py: Python<'_>) -> PyResult<()> {
        let g = self.g()?;
        py.allow_threads(|| g.barrier()).map_err(coll_to_py)
    }

    /// Rank `root`'s contents of `buf` (any writable buffer, e.g. a numpy array) into every
    /// rank's `buf`, in place.
    fn bcast(&mut self, py: Python<'_>, root: usize, buf: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut b = RawBuffer::get(buf, true)?;
        let (g, buf) = (self.g()?, b.as_mut_slice());
        py.allow_threads(|| g.bcast(root, buf)).map_err(coll_to_py)
    }

    /// Reduce `array` (a writable numpy array or buffer of u32, u64, i32, i64, f32 or f64)
    /// over the ranks with `op` ("sum", "min", "max", "prod"), the result in place at every
    /// rank.
    #[pyo3(signature = (array, op="sum"))]
    fn allreduce(&mut self, py: Python<'_>, array: &Bound<'_, PyAny>, op: &str) -> PyResult<()> {
        let op = reduce_op(op)?;
        let mut b = RawBuffer::get_typed(array)?;
        let g = self.g()?;
        typed!(b, "allreduce", v => py.allow_threads(|| g.allreduce(v, op))).map_err(coll_to_py)
    }

    /// Reduce `array` (as for `allreduce`) over the ranks with `op`, the result in place at
    /// rank `root` (elsewhere `array` serves as scratch).
    #[pyo3(signature = (root, array, op="sum"))]
    fn reduce(&mut self, py: Python<'_>, root: usize, array: &Bound<'_, PyAny>, op: &str) -> PyResult<()> {
        let op = reduce_op(op)?;
        let mut b = RawBuffer::get_typed(array)?;
        let g = self.g()?;
        typed!(b, "reduce", v => py.allow_threads(|| g.reduce(root, v, op))).map_err(coll_to_py)
    }

    /// Rank `root`'s `send` (`len(recv)` bytes for each rank, by rank; read at `root` only,
    /// `None` elsewhere) cut into blocks: block j into rank j's `recv` (a writable buffer).
    #[pyo3(signature = (root, send, recv))]
    fn scatter(
        &mut self,
        py: Python<'_>,
        root: usize,
        send: Option<&Bound<'_, PyAny>>,
        recv: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let mut r = RawBuffer::get(recv, true)?;
        let g = self.g()?;
        let s = at_root(g.rank() == root, send, "send")?;
        apart(s.as_ref(), Some(&r))?;
        let (send, recv) = (s.as_ref().map_or(&[][..], ReadBuf::as_slice), r.as_mut_slice());
        py.allow_threads(|| g.scatter(root, send, recv)).map_err(coll_to_py)
    }

    /// Rank `root`'s `send` cut by `counts` (bytes per rank): `counts[j]` bytes into rank j's
    /// `recv` (writable, as long as its count). `send` and `counts` are read at `root` only.
    #[pyo3(signature = (root, send, counts, recv))]
    fn scatterv(
        &mut self,
        py: Python<'_>,
        root: usize,
        send: Option<&Bound<'_, PyAny>>,
        counts: Option<Vec<usize>>,
        recv: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let mut r = RawBuffer::get(recv, true)?;
        let g = self.g()?;
        let s = at_root(g.rank() == root, send, "send")?;
        let c = counts.unwrap_or_default();
        apart(s.as_ref(), Some(&r))?;
        let (send, recv) = (s.as_ref().map_or(&[][..], ReadBuf::as_slice), r.as_mut_slice());
        py.allow_threads(|| g.scatterv(root, send, &c, recv)).map_err(coll_to_py)
    }

    /// Every rank's `send` (the same length at every rank), by rank, into rank `root`'s `recv`
    /// (writable, that length times the ranks; `None` elsewhere).
    #[pyo3(signature = (root, send, recv=None))]
    fn gather(
        &mut self,
        py: Python<'_>,
        root: usize,
        send: &Bound<'_, PyAny>,
        recv: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = ReadBuf::get(send)?;
        let g = self.g()?;
        let mut r = writable_at_root(g.rank() == root, recv)?;
        apart(Some(&s), r.as_ref())?;
        let (send, recv) = (s.as_slice(), r.as_mut().map_or(&mut [][..], RawBuffer::as_mut_slice));
        py.allow_threads(|| g.gather(root, send, recv)).map_err(coll_to_py)
    }

    /// Every rank's `send`, by rank, into rank `root`'s `recv`, rank j's taking `counts[j]`
    /// bytes (its length). `counts` and `recv` are used at `root` only.
    #[pyo3(signature = (root, send, counts=None, recv=None))]
    fn gatherv(
        &mut self,
        py: Python<'_>,
        root: usize,
        send: &Bound<'_, PyAny>,
        counts: Option<Vec<usize>>,
        recv: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let s = ReadBuf::get(send)?;
        let g = self.g()?;
        let mut r = writable_at_root(g.rank() == root, recv)?;
        let c = counts.unwrap_or_default();
        apart(Some(&s), r.as_ref())?;
        let (send, recv) = (s.as_slice(), r.as_mut().map_or(&mut [][..], RawBuffer::as_mut_slice));
        py.allow_threads(|| g.gatherv(root, send, &c, recv)).map_err(coll_to_py)
    }

    /// Every rank's `send`, by rank, as one bytes object at every rank; rank j gives
    /// `counts[j]` bytes (the same counts at every rank).
    fn allgatherv<'py>(
        &mut self,
        py: Python<'py>,
        send: &Bound<'_, PyAny>,
        counts: Vec<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let s = ReadBuf::get(send)?;
        let g = self.g()?;
        let send = s.as_slice();
        new_bytes(py, byte_total(&counts)?, |out| g.allgatherv(send, &counts, out))
    }

    /// `send_counts[j]` bytes of `send` (packed by rank) to rank j; from rank j
    /// `recv_counts[j]` bytes, packed by rank into the bytes object returned.
    fn alltoallv<'py>(
        &mut self,
        py: Python<'py>,
        send: &Bound<'_, PyAny>,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let s = ReadBuf::get(send)?;
        let g = self.g()?;
        let send = s.as_slice();
        new_bytes(py, byte_total(&recv_counts)?, |out| g.alltoallv(send, &send_counts, out, &recv_counts))
    }

    /// Every rank's `data` (the same length at every rank), by rank, as one bytes object.
    fn allgather<'py>(&mut self, py: Python<'py>, data: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let b = ReadBuf::get(data)?;
        let g = self.g()?;
        let (send, len) = (b.as_slice(), b.len() * g.size());
        new_bytes(py, len, |out| g.allgather(send, out))
    }

    /// Block j of `send` (size divided by the ranks) to rank j; block j of the result from
    /// rank j.
    fn alltoall<'py>(&mut self, py: Python<'py>, send: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyBytes>> {
        let b = ReadBuf::get(send)?;
        let g = self.g()?;
        if b.len() % g.size() != 0 {
            return Err(bad(format!("{} bytes do not split into {} blocks", b.len(), g.size())));
        }
        let send = b.as_slice();
        new_bytes(py, send.len(), |out| g.alltoall(send, out))
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
