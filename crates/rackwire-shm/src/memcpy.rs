//! Byte copies that stay fast whatever the relative alignment of source and destination.
//!
//! The C library's `memcpy` switches to the `rep movsb` instruction above a few KiB. On some
//! processors (AMD Zen 3 and 4 among them) that instruction is more than ten times slower
//! when the destination sits a little above the source modulo 4 KiB — which is exactly the
//! case for a page-aligned window slot copied into a heap buffer that starts 16 bytes into
//! its page (measured here: 1 MiB at 2.9 GB/s, against 29 GB/s at other offsets). Calls of
//! at most [`COPY_CALL_BYTES`] keep the library on its vector loop, but that loop, too, runs
//! at half speed at such offsets (16 GB/s).
//!
//! So where the processor has AVX2 (the standard library's run-time check, cached), a copy of
//! [`VECTOR_MIN_BYTES`] or more runs its own loop: the first bytes up to a 64-byte boundary of
//! the destination, then 128 bytes an iteration with unaligned loads and aligned stores (no
//! store ever splits a cache line, whatever the source's offset), then the tail. Measured on
//! this machine with data in the cache: 1 MiB from a page-aligned source to destination
//! offsets 16 and 48, 37 GB/s, where the library's `memcpy` gives 2.9 and 37 and calls of
//! 2 KiB 16 and 28; a region read into a heap buffer (offset 16) 35–36 GB/s against 30 with
//! calls of 2 KiB, 64 KiB 49–50 against 38–39; writes from the heap 9–15% faster. Without AVX2,
//! calls of at most [`COPY_CALL_BYTES`].

/// The largest single `memcpy` call where there is no vector loop (below the library's
/// `rep movsb` threshold, 4 KiB or more on x86-64).
pub const COPY_CALL_BYTES: usize = 2048;

/// Copies at least this long take the vector loop (shorter ones are a few vector moves in
/// the library, with no `rep movsb`).
pub const VECTOR_MIN_BYTES: usize = 512;

/// Copy `src` into `dst` (which must have the same length, as for `copy_from_slice`).
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    // SAFETY: two distinct slices of equal length (a `&mut` cannot overlap a `&`).
    #[allow(unsafe_code)]
    unsafe {
        copy_raw(src.as_ptr(), dst.as_mut_ptr(), src.len())
    };
}

/// Copy `len` bytes from `src` to `dst`, which may overlap: foreign code can hand a window's
/// own memory to a copy into or out of that window (Python's `memoryview(region)`, a C
/// pointer from `rw_region_ptr`). Ranges that do not overlap take [`copy_raw`].
///
/// # Safety
/// As [`copy_raw`], but for the overlap.
#[allow(unsafe_code)]
pub(crate) unsafe fn copy_raw_overlapping(src: *const u8, dst: *mut u8, len: usize) {
    let (s, d) = (src as usize, dst as usize);
    if s < d.wrapping_add(len) && d < s.wrapping_add(len) {
        // SAFETY: both ranges are valid for `len` bytes (the caller vouches); `ptr::copy` is
        // defined for overlapping ranges.
        unsafe { std::ptr::copy(src, dst, len) };
    } else {
        // SAFETY: valid (the caller vouches) and, as just checked, not overlapping.
        unsafe { copy_raw(src, dst, len) };
    }
}

/// Raw form of [`copy_bytes`] for mapped memory.
///
/// # Safety
///
/// As for [`std::ptr::copy_nonoverlapping`]: `src` readable and `dst` writable for `len`
/// bytes, the two ranges not overlapping.
#[allow(unsafe_code)]
pub(crate) unsafe fn copy_raw(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if len >= VECTOR_MIN_BYTES && std::is_x86_feature_detected!("avx2") {
        // SAFETY: the caller vouches for both ranges; AVX2 was found on this processor.
        unsafe { vector::copy(src, dst, len) };
        return;
    }
    // SAFETY: as the caller vouched.
    unsafe { copy_calls(src, dst, len) };
}

/// The copy in calls of at most [`COPY_CALL_BYTES`].
///
/// # Safety
///
/// As for [`copy_raw`].
#[allow(unsafe_code)]
unsafe fn copy_calls(src: *const u8, dst: *mut u8, len: usize) {
    let mut done = 0;
    while done < len {
        let n = COPY_CALL_BYTES.min(len - done);
        // SAFETY: `done + n <= len`, so both ranges stay inside what the caller vouched for.
        unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n) };
        done += n;
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vector {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_store_si256};

    /// Bytes one iteration moves.
    const STEP: usize = 128;

    /// The copy with aligned stores (see the module documentation).
    ///
    /// # Safety
    ///
    /// As for [`super::copy_raw`], and the processor has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
        // Bytes up to the destination's next cache line (all of them, should the offset be
        // unknown: `align_offset` may say `usize::MAX`).
        let head = dst.align_offset(64).min(len);
        // SAFETY: `head <= len`: inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let mut at = head;
        while len - at >= STEP {
            // SAFETY: `at + STEP <= len`, inside both ranges; `dst + at` is 64-byte aligned
            // (it starts at a boundary and moves by 128), as the aligned store needs; the
            // loads are unaligned ones.
            unsafe {
                let (s, d) = (src.add(at) as *const __m256i, dst.add(at) as *mut __m256i);
                let a = _mm256_loadu_si256(s);
                let b = _mm256_loadu_si256(s.add(1));
                let c = _mm256_loadu_si256(s.add(2));
                let e = _mm256_loadu_si256(s.add(3));
                _mm256_store_si256(d, a);
                _mm256_store_si256(d.add(1), b);
                _mm256_store_si256(d.add(2), c);
                _mm256_store_si256(d.add(3), e);
            }
            at += STEP;
        }
        // SAFETY: the rest, `len - at < STEP` bytes, inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that copies equal the source for lengths around the chunk size, the vector
    // threshold and the loop's step, at every small misalignment of either end, and that
    // nothing outside the destination is touched; and that a length mismatch is refused like
    // copy_from_slice.
    #[test]
    fn copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 63, 64, 127, 511, 512, 513, 640, 2047, 2048, 2049, 4096, 10_001] {
            for off in [0, 1, 8, 16, 63] {
                for soff in [0, 5, 32] {
                    let mut dst = vec![0u8; len + 128];
                    copy_bytes(&mut dst[off..off + len], &src[soff..soff + len]);
                    assert_eq!(&dst[off..off + len], &src[soff..soff + len], "len {len} off {off} soff {soff}");
                    assert!(dst[..off].iter().all(|&b| b == 0) && dst[off + len..].iter().all(|&b| b == 0));
                }
            }
        }
        assert!(std::panic::catch_unwind(|| copy_bytes(&mut [0u8; 3], &[1u8; 4])).is_err());
    }
}
