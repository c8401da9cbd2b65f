//! Byte copies that stay fast whatever the relative alignment of source and destination.
//!
//! The C library's `memcpy` switches to the `rep movsb` instruction above a few KiB. On some
//! processors (AMD Zen 3 and 4 among them) that instruction is more than ten times slower
//! when the destination sits a little above the source modulo 4 KiB — which is exactly the
//! case for a page-aligned window slot copied into a heap buffer that starts 16 bytes into
//! its page. Measured here: a 64 KiB copy at 2.7 GB/s whole, 47 GB/s in 2 KiB calls. Every
//! copy of the data path therefore goes in calls of [`COPY_CALL_BYTES`] at most, which keep
//! the library on its vector loop; the extra calls cost nothing measurable.

/// The largest single `memcpy` call (below the library's `rep movsb` threshold, 4 KiB or
/// more on x86-64).
pub const COPY_CALL_BYTES: usize = 2048;

/// Copy `src` into `dst` (which must have the same length, as for `copy_from_slice`).
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: lengths differ");
    for (d, s) in dst.chunks_mut(COPY_CALL_BYTES).zip(src.chunks(COPY_CALL_BYTES)) {
        d.copy_from_slice(s);
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
    let mut done = 0;
    while done < len {
        let n = COPY_CALL_BYTES.min(len - done);
        // SAFETY: `done + n <= len`, so both ranges stay inside what the caller vouched for.
        unsafe { std::ptr::copy_nonoverlapping(src.add(done), dst.add(done), n) };
        done += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that chunked copies equal the source for lengths around the chunk size and at
    // every small misalignment, and that a length mismatch is refused like copy_from_slice.
    #[test]
    fn copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..20_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 2047, 2048, 2049, 4096, 10_001] {
            for off in [0, 1, 8, 63] {
                let mut dst = vec![0u8; len + 64];
                copy_bytes(&mut dst[off..off + len], &src[..len]);
                assert_eq!(&dst[off..off + len], &src[..len], "len {len} off {off}");
                assert!(dst[..off].iter().all(|&b| b == 0) && dst[off + len..].iter().all(|&b| b == 0));
            }
        }
        assert!(std::panic::catch_unwind(|| copy_bytes(&mut [0u8; 3], &[1u8; 4])).is_err());
    }
}
