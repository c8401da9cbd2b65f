//! The application's buffers. libfabric's contract: a buffer handed to an operation stays
//! valid, and the application does not touch it, until the operation's completion is read
//! (a send's buffer only until the call returns: this provider copies it at once). This
//! module is the only place that reads or writes through the addresses the application gave.
#![allow(unsafe_code)]

/// One piece of an application buffer (`struct iovec`), kept as plain numbers so the queues
/// that hold it are `Send`; laid out as [`RawIov`], so a C array of them is read in place.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Iov {
    /// Its address.
    pub base: usize,
    /// Its length.
    pub len: usize,
}

/// Pieces of one buffer held without an allocation when there are at most
/// [`IOVS_INLINE`] (almost every operation gives one): a posted receive or a send waiting
/// for room keeps its list with no trip to the allocator on the message path.
#[derive(Clone, Debug)]
pub enum Iovs {
    /// Up to [`IOVS_INLINE`] pieces, the first `n` of `v`.
    Inline {
        /// Pieces in use.
        n: u8,
        /// The pieces.
        v: [Iov; IOVS_INLINE],
    },
    /// More pieces.
    Heap(Vec<Iov>),
}

/// Pieces an [`Iovs`] holds without an allocation.
pub const IOVS_INLINE: usize = 2;

impl From<&[Iov]> for Iovs {
    fn from(iov: &[Iov]) -> Self {
        if iov.len() <= IOVS_INLINE {
            let mut v = [Iov::default(); IOVS_INLINE];
            v[..iov.len()].copy_from_slice(iov);
            Iovs::Inline { n: iov.len() as u8, v }
        } else {
            Iovs::Heap(iov.to_vec())
        }
    }
}

impl Iovs {
    /// One piece.
    pub fn one(v: Iov) -> Self {
        Iovs::from(std::slice::from_ref(&v))
    }
}

impl std::ops::Deref for Iovs {
    type Target = [Iov];
    fn deref(&self) -> &[Iov] {
        match self {
            Iovs::Inline { n, v } => &v[..usize::from(*n)],
            Iovs::Heap(v) => v,
        }
    }
}

impl std::ops::DerefMut for Iovs {
    fn deref_mut(&mut self) -> &mut [Iov] {
        match self {
            Iovs::Inline { n, v } => &mut v[..usize::from(*n)],
            Iovs::Heap(v) => v,
        }
    }
}

/// The `struct iovec` of the C side.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawIov {
    /// Base.
    pub base: *mut u8,
    /// Length.
    pub len: usize,
}

/// Total bytes of `iov`.
pub fn capacity(iov: &[Iov]) -> usize {
    iov.iter().map(|v| v.len).sum()
}

/// Copy `data` into `iov` from byte `at` of the buffer it describes, as far as it reaches;
/// the bytes copied.
pub fn scatter(iov: &[Iov], mut at: usize, mut data: &[u8]) -> usize {
    let mut copied = 0;
    for v in iov {
        if data.is_empty() {
            break;
        }
        if at >= v.len {
            at -= v.len;
            continue;
        }
        let n = (v.len - at).min(data.len());
        // SAFETY: the application gave `v` for this receive and keeps it valid and untouched
        // until its completion (libfabric's contract); `at + n <= v.len`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (v.base as *mut u8).add(at), n) };
        copied += n;
        data = &data[n..];
        at = 0;
    }
    copied
}

/// Copy bytes `at..at + out.len()` of the buffer `iov` describes into `out` (as far as it
/// reaches); the bytes copied.
pub fn copy_out(iov: &[Iov], mut at: usize, out: &mut [u8]) -> usize {
    let mut copied = 0;
    for v in iov {
        if copied == out.len() {
            break;
        }
        if at >= v.len {
            at -= v.len;
            continue;
        }
        let n = (v.len - at).min(out.len() - copied);
        // SAFETY: the application gave `v` to this send and keeps it valid and unchanged
        // until the send's completion (libfabric's contract); `at + n <= v.len`.
        let src = unsafe { std::slice::from_raw_parts((v.base as *const u8).add(at), n) };
        out[copied..copied + n].copy_from_slice(src);
        copied += n;
        at = 0;
    }
    copied
}

/// Memory the application registered (`fi_mr_reg`) and a peer may reach through its key:
/// valid from registration until the region is closed (libfabric's contract). Only the
/// provider's progress touches it, under the provider's lock, after checking that the range
/// lies inside a region still registered.
#[derive(Clone, Copy, Debug)]
pub struct Registered {
    /// Start address.
    pub base: usize,
    /// Bytes.
    pub len: usize,
}

impl Registered {
    /// `addr..addr + n` lies inside.
    pub fn holds(&self, addr: u64, n: usize) -> bool {
        let Ok(addr) = usize::try_from(addr) else { return false };
        let Some(limit) = self.base.checked_add(self.len) else { return false };
        addr >= self.base && addr.checked_add(n).is_some_and(|end| end <= limit)
    }

    /// A copy of `n` bytes at `addr` (inside: see [`Registered::holds`]).
    pub fn read(&self, addr: u64, n: usize) -> Vec<u8> {
        assert!(self.holds(addr, n), "callers check the range first");
        // SAFETY: the range lies inside registered memory, valid until the region is closed,
        // which cannot happen while the provider's lock (held by our caller) is held.
        unsafe { std::slice::from_raw_parts(addr as usize as *const u8, n) }.to_vec()
    }

    /// Copy the bytes at `addr` into `out` (inside: see [`Registered::holds`]).
    pub fn copy_out(&self, addr: u64, out: &mut [u8]) {
        assert!(self.holds(addr, out.len()), "callers check the range first");
        // SAFETY: as in `read`: the range lies inside registered memory, which stays valid
        // while the provider's lock is held and is not closed with an answer reading it
        // queued (closing copies what is left first).
        out.copy_from_slice(unsafe { std::slice::from_raw_parts(addr as usize as *const u8, out.len()) });
    }

    /// Run `f` on the `n` bytes at `addr` (inside: see [`Registered::holds`]).
    pub fn with_mut<T>(&self, addr: u64, n: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
        assert!(self.holds(addr, n), "callers check the range first");
        // SAFETY: as in `read`; the application hands this memory to remote peers by
        // registering it, and only the provider writes it on their behalf, one at a time.
        f(unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u8, n) })
    }
}

/// Append the bytes of `iov` to `out`.
pub fn gather(iov: &[Iov], out: &mut Vec<u8>) {
    for v in iov {
        if v.len == 0 {
            continue;
        }
        // SAFETY: the application gave `v` to this send and keeps it valid during the call
        // (libfabric's contract); it is read once, here.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(v.base as *const u8, v.len) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a piece list keeps its pieces in order whatever its length: up to
    // IOVS_INLINE pieces inline, more on the heap (the slice seen equals the one given), and
    // that a piece changed through the mutable view is the one read back.
    #[test]
    fn piece_lists_keep_their_pieces_inline_or_not() {
        for n in 0..=IOVS_INLINE + 2 {
            let given: Vec<Iov> = (0..n).map(|i| Iov { base: 0x1000 * (i + 1), len: i + 7 }).collect();
            let mut kept = Iovs::from(given.as_slice());
            assert_eq!(&kept[..], &given[..], "{n} pieces");
            assert_eq!(matches!(kept, Iovs::Inline { .. }), n <= IOVS_INLINE, "{n} pieces");
            if n > 0 {
                kept[n - 1].len = 1;
                assert_eq!(kept[n - 1], Iov { base: 0x1000 * n, len: 1 });
            }
        }
        assert_eq!(&Iovs::one(Iov { base: 5, len: 6 })[..], &[Iov { base: 5, len: 6 }]);
    }

    // Checks scattering into a buffer of three pieces from an offset inside the second: the
    // bytes land across the piece boundary in order, nothing is written past the end, and
    // the count says how much fit; gathering reads the pieces back in order.
    #[test]
    fn scatter_and_gather_follow_the_pieces() {
        let mut a = [0u8; 4];
        let mut b = [0u8; 3];
        let mut c = [0u8; 2];
        let iov = [
            Iov { base: a.as_mut_ptr() as usize, len: a.len() },
            Iov { base: b.as_mut_ptr() as usize, len: b.len() },
            Iov { base: c.as_mut_ptr() as usize, len: c.len() },
        ];
        assert_eq!(capacity(&iov), 9);
        assert_eq!(scatter(&iov, 5, b"wxyz!"), 4);
        assert_eq!((a, b, c), ([0; 4], [0, b'w', b'x'], [b'y', b'z']));
        let mut out = Vec::new();
        gather(&iov, &mut out);
        assert_eq!(out, b"\0\0\0\0\0wxyz");
        let mut part = [0u8; 3];
        assert_eq!(copy_out(&iov, 4, &mut part), 3);
        assert_eq!(&part, b"\0wx");
        let mut tail = [9u8; 4];
        assert_eq!(copy_out(&iov, 7, &mut tail), 2, "only two bytes are left past 7");
        assert_eq!(&tail, b"yz\x09\x09");
    }

    // Checks the range test of registered memory: a range inside and one touching the end
    // pass; one a byte past the end, one starting before the region, a length that wraps the
    // address space and a region whose own end would wrap all fail (none panics).
    #[test]
    fn registered_ranges_are_checked_without_wrapping() {
        let r = Registered { base: 4096, len: 100 };
        assert!(r.holds(4096, 100) && r.holds(4100, 10) && r.holds(4196, 0));
        assert!(!r.holds(4100, 97) && !r.holds(4095, 1) && !r.holds(4100, usize::MAX));
        assert!(!r.holds(u64::MAX, 1));
        let wrapping = Registered { base: usize::MAX - 10, len: 100 };
        assert!(!wrapping.holds((usize::MAX - 5) as u64, 1));
    }
}
