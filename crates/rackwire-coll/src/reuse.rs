//! Vectors the collectives keep between calls, so that a warm call allocates nothing.
//!
//! A step's sends and receives borrow the caller's buffers, so their vectors cannot be kept
//! as they are; emptied, they can: an empty vector of one lifetime becomes an empty vector
//! of another through an in-place collect, which keeps its allocation.

use crate::channel::{RecvSpec, SendSpec};

/// An empty vector of `T` turned into an empty vector of `U` (the same type under another
/// lifetime), keeping its allocation.
fn relabel<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}

/// Kept between calls.
#[derive(Default)]
pub(crate) struct Reuse {
    sends: Vec<SendSpec<'static>>,
    recvs: Vec<RecvSpec<'static>>,
    /// Offsets of packed blocks (two sets: alltoallv has both sides packed).
    pub offs: Vec<usize>,
    pub offs_recv: Vec<usize>,
    /// Equal counts for the collectives that take one length.
    pub counts: Vec<usize>,
    /// Places this rank names, places it was named, and small blocks staged before they go
    /// into place (collectives into registered memory).
    pub place_out: Vec<u8>,
    pub place_in: Vec<u8>,
    pub stage: Vec<u8>,
}

impl Reuse {
    /// Empty vectors for one step's sends and receives.
    pub(crate) fn take<'a>(&mut self) -> (Vec<SendSpec<'a>>, Vec<RecvSpec<'a>>) {
        (relabel(std::mem::take(&mut self.sends)), relabel(std::mem::take(&mut self.recvs)))
    }

    /// Give them back once the step is done.
    pub(crate) fn keep(&mut self, sends: Vec<SendSpec<'_>>, recvs: Vec<RecvSpec<'_>>) {
        self.sends = relabel(sends);
        self.recvs = relabel(recvs);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the premise of this module: a vector handed back and taken again keeps its
    // allocation (same address and capacity), so a warm step allocates nothing.
    #[test]
    fn taken_again_keeps_the_allocation() {
        let mut r = Reuse::default();
        let data = vec![1u8; 16];
        let (mut s, v) = r.take();
        s.extend((0..8).map(|to| SendSpec { to, data: &data, place: None }));
        let (ptr, cap) = (s.as_ptr() as usize, s.capacity());
        r.keep(s, v);
        let (s, _) = r.take();
        assert!(s.is_empty());
        assert_eq!((s.as_ptr() as usize, s.capacity()), (ptr, cap));
    }
}
