//! A page's diff: the runs of 8-byte words where it differs from its twin, encoded for the
//! wire, and applied at the page's home.
//!
//! Encoding (little-endian): the number of runs (`u32`), then for each run its offset and its
//! length in bytes (`u32` each, both multiples of 8, the run inside the page) and its bytes.
//! Runs come in increasing offset order and do not touch. A diff arrives from a peer, so
//! [`apply`] checks every field before it writes a byte, and refuses the whole diff when one is
//! wrong.

use crate::PAGE_BYTES;

/// The granularity of a diff: words that differ are sent whole.
pub const WORD: usize = 8;
/// The most runs a page's diff can have (every other word differs).
pub const RUNS_MAX: usize = PAGE_BYTES / WORD / 2 + 1;
/// The largest encoded diff of one page: every word in runs of one word.
pub const DIFF_BYTES_MAX: usize = 4 + RUNS_MAX * 8 + PAGE_BYTES;

/// Why a diff was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    /// The diff ended inside a field.
    #[error("diff truncated at byte {at}")]
    Truncated {
        /// Where the missing bytes begin.
        at: usize,
    },
    /// A run lies outside the page, is not word-aligned, is empty, or overlaps or touches the
    /// one before.
    #[error("diff run {index} ({offset}+{len}) is not a run of whole words inside the page after the one before")]
    BadRun {
        /// The run's index.
        index: usize,
        /// Its offset.
        offset: u32,
        /// Its length.
        len: u32,
    },
    /// More runs than a page can have.
    #[error("diff of {0} runs: a page has at most {RUNS_MAX}")]
    TooManyRuns(u32),
    /// Bytes after the last run.
    #[error("diff has {0} bytes after its last run")]
    Trailing(usize),
    /// The page given is not a page.
    #[error("page of {0} bytes, not {PAGE_BYTES}")]
    NotAPage(usize),
}

/// The diff of a page written whole (every word sent, whatever it was): one run.
pub fn whole(page: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + page.len());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(page.len() as u32).to_le_bytes());
    out.extend_from_slice(page);
    out
}

/// The diff of `page` against its `twin` (both a page long), encoded: empty runs list when
/// they are equal.
pub fn encode(twin: &[u8], page: &[u8]) -> Result<Vec<u8>, DiffError> {
    for p in [twin, page] {
        if p.len() != PAGE_BYTES {
            return Err(DiffError::NotAPage(p.len()));
        }
    }
    let mut out = vec![0u8; 4];
    let mut runs = 0u32;
    let mut w = 0;
    let words = PAGE_BYTES / WORD;
    while w < words {
        let differs = |w: usize| twin[w * WORD..(w + 1) * WORD] != page[w * WORD..(w + 1) * WORD];
        if !differs(w) {
            w += 1;
            continue;
        }
        let start = w;
        while w < words && differs(w) {
            w += 1;
        }
        let (off, len) = (start * WORD, (w - start) * WORD);
        out.extend_from_slice(&(off as u32).to_le_bytes());
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&page[off..off + len]);
        runs += 1;
    }
    out[..4].copy_from_slice(&runs.to_le_bytes());
    Ok(out)
}

/// The runs of an encoded diff, checked: `(offset, bytes)` each.
pub fn runs(diff: &[u8]) -> Result<Vec<(usize, &[u8])>, DiffError> {
    let u32_at = |at: usize| -> Result<u32, DiffError> {
        diff.get(at..at + 4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or(DiffError::Truncated { at })
    };
    let count = u32_at(0)?;
    if count as usize > RUNS_MAX {
        return Err(DiffError::TooManyRuns(count));
    }
    let mut at = 4;
    let mut end_before = None;
    let mut out = Vec::with_capacity(count as usize);
    for index in 0..count as usize {
        let (offset, len) = (u32_at(at)?, u32_at(at + 4)?);
        at += 8;
        let (o, l) = (offset as usize, len as usize);
        let fits = l > 0 && o % WORD == 0 && l % WORD == 0 && o.checked_add(l).is_some_and(|e| e <= PAGE_BYTES);
        // Runs are maximal: the next starts past a word that did not differ.
        let after = end_before.is_none_or(|e: usize| o > e);
        if !fits || !after {
            return Err(DiffError::BadRun { index, offset, len });
        }
        let bytes = diff.get(at..at + l).ok_or(DiffError::Truncated { at })?;
        at += l;
        end_before = Some(o + l);
        out.push((o, bytes));
    }
    if at != diff.len() {
        return Err(DiffError::Trailing(diff.len() - at));
    }
    Ok(out)
}

/// Apply an encoded diff to `page` (a page long). Nothing is written unless the whole diff is
/// well formed.
pub fn apply(diff: &[u8], page: &mut [u8]) -> Result<(), DiffError> {
    if page.len() != PAGE_BYTES {
        return Err(DiffError::NotAPage(page.len()));
    }
    for (off, bytes) in runs(diff)? {
        page[off..off + bytes.len()].copy_from_slice(bytes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn page(fill: u8) -> Vec<u8> {
        vec![fill; PAGE_BYTES]
    }

    // Checks a diff by hand: two changed words apart and three in a row give two runs with
    // their words; equal pages give no runs; applying the diff to the twin gives the page.
    #[test]
    fn a_diff_holds_the_changed_words_only() {
        let twin = page(0);
        let mut cur = twin.clone();
        cur[8] = 1;
        cur[100..120].fill(2);
        let d = encode(&twin, &cur).unwrap();
        let r = runs(&d).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].0, r[0].1.len()), (8, 8));
        assert_eq!((r[1].0, r[1].1.len()), (96, 24));
        let mut back = twin.clone();
        apply(&d, &mut back).unwrap();
        assert_eq!(back, cur);
        assert_eq!(encode(&twin, &twin).unwrap(), 0u32.to_le_bytes());
        assert_eq!(encode(&twin, &cur[..100]), Err(DiffError::NotAPage(100)));
    }

    // Checks that malformed diffs are refused before a byte is written: a run past the page,
    // a misaligned one, an empty one, one overlapping the one before, a truncated one, too
    // many runs, trailing bytes.
    // Checks the whole-page diff: applied to any page it gives the written page exactly, and
    // decodes as one run of the whole page.
    #[test]
    fn a_whole_diff_gives_the_page_over_anything() {
        let written = page(7);
        let d = whole(&written);
        assert_eq!(runs(&d).unwrap(), vec![(0, &written[..])]);
        let mut at_home = page(99);
        apply(&d, &mut at_home).unwrap();
        assert_eq!(at_home, written);
    }

    #[test]
    fn a_bad_diff_is_refused_whole() {
        let run = |off: u32, len: u32| {
            let mut v = off.to_le_bytes().to_vec();
            v.extend_from_slice(&len.to_le_bytes());
            v.extend(std::iter::repeat_n(9u8, len as usize));
            v
        };
        let diff = |runs: &[Vec<u8>]| {
            let mut v = (runs.len() as u32).to_le_bytes().to_vec();
            for r in runs {
                v.extend_from_slice(r);
            }
            v
        };
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (diff(&[run(0, 8), run(PAGE_BYTES as u32, 8)]), "past the page"),
            (diff(&[run(4, 8)]), "misaligned"),
            (diff(&[run(0, 0)]), "empty"),
            (diff(&[run(0, 16), run(8, 8)]), "overlapping"),
            (diff(&[run(0, 8), run(8, 8)]), "touching"),
            (diff(&[run(0, 8)])[..10].to_vec(), "truncated"),
            ((RUNS_MAX as u32 + 1).to_le_bytes().to_vec(), "too many runs"),
            ([diff(&[run(0, 8)]), vec![1]].concat(), "trailing"),
            (vec![1, 0], "no count"),
        ];
        for (d, what) in cases {
            let mut p = page(0);
            assert!(apply(&d, &mut p).is_err(), "{what}: accepted");
            assert_eq!(p, page(0), "{what}: wrote before refusing");
        }
    }

    proptest! {
        // Checks, on random pages differing in random words, that the diff applied to the twin
        // gives the page, that it never exceeds DIFF_BYTES_MAX, and that its runs check.
        #[test]
        fn a_diff_applied_to_its_twin_gives_the_page(
            twin in proptest::collection::vec(any::<u8>(), PAGE_BYTES),
            changes in proptest::collection::vec((0usize..PAGE_BYTES, any::<u8>()), 0..200),
        ) {
            let mut cur = twin.clone();
            for (at, b) in changes {
                cur[at] = b;
            }
            let d = encode(&twin, &cur).unwrap();
            prop_assert!(d.len() <= DIFF_BYTES_MAX);
            let mut back = twin.clone();
            apply(&d, &mut back).unwrap();
            prop_assert_eq!(back, cur);
        }

        // Checks that any bytes given as a diff are refused or applied within the page, never
        // a panic (a diff comes from a peer).
        #[test]
        fn any_bytes_as_a_diff_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut p = vec![0u8; PAGE_BYTES];
            let _ = apply(&bytes, &mut p);
        }
    }
}
