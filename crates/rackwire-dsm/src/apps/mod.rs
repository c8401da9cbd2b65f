//! Applications of the shared memory, SPLASH-2's algorithms written anew: each runs over any
//! [`Memory`] (a job's shared range, or one process's plain memory, against which every shared
//! run is checked) with its ranks splitting the work and a barrier between phases.

pub mod fft;
pub mod lu;
pub mod radix;
pub mod water;

use crate::{DsmError, SharedMemory};

/// Rank `rank`'s share of `n` items among `ranks`: a contiguous block, the last ones shorter.
pub(crate) fn share(n: usize, rank: usize, ranks: usize) -> std::ops::Range<usize> {
    let per = n.div_ceil(ranks.max(1));
    (rank * per).min(n)..((rank + 1) * per).min(n)
}

/// Words of memory the ranks share, and a barrier.
pub trait Memory {
    /// The word at index `i`.
    fn word(&mut self, i: usize) -> Result<u64, DsmError>;
    /// Set the word at index `i`.
    fn set_word(&mut self, i: usize, v: u64) -> Result<(), DsmError>;
    /// The word at index `i` as a number.
    #[inline]
    fn get(&mut self, i: usize) -> Result<f64, DsmError> {
        self.word(i).map(f64::from_bits)
    }
    /// Set the word at index `i` to a number.
    #[inline]
    fn set(&mut self, i: usize, v: f64) -> Result<(), DsmError> {
        self.set_word(i, v.to_bits())
    }
    /// The words from index `i` on, into `out`.
    fn read_words(&mut self, i: usize, out: &mut [u64]) -> Result<(), DsmError> {
        for (k, o) in out.iter_mut().enumerate() {
            *o = self.word(i + k)?;
        }
        Ok(())
    }
    /// Set the words from index `i` on to `words`.
    fn write_words(&mut self, i: usize, words: &[u64]) -> Result<(), DsmError> {
        for (k, w) in words.iter().enumerate() {
            self.set_word(i + k, *w)?;
        }
        Ok(())
    }
    /// Words about to be read, `(index, words)` each: fetched together where that helps (by
    /// default, nothing).
    fn prefetch(&mut self, _spans: &[(usize, usize)]) -> Result<(), DsmError> {
        Ok(())
    }
    /// The numbers from index `i` on, into `out`.
    fn read_numbers(&mut self, i: usize, out: &mut [f64]) -> Result<(), DsmError> {
        self.read_words(i, bytemuck::cast_slice_mut(out))
    }
    /// Set the numbers from index `i` on to `numbers`.
    fn write_numbers(&mut self, i: usize, numbers: &[f64]) -> Result<(), DsmError> {
        self.write_words(i, bytemuck::cast_slice(numbers))
    }
    /// Every rank's writes before it are seen by every rank after it.
    fn barrier(&mut self) -> Result<(), DsmError>;
    /// Take lock `l`: what its earlier holders wrote is seen after it.
    fn lock(&mut self, l: usize) -> Result<(), DsmError>;
    /// Release lock `l`.
    fn unlock(&mut self, l: usize) -> Result<(), DsmError>;
    /// This rank, and the ranks.
    fn rank(&self) -> usize;
    /// Ranks sharing the memory.
    fn ranks(&self) -> usize;
}

/// One process's memory: one rank, whose barrier is nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plain(pub Vec<u64>);

impl Plain {
    /// `words` words of zeros.
    pub fn zeroed(words: usize) -> Plain {
        Plain(vec![0; words])
    }

    #[cold]
    fn out_of_range(&self, i: usize) -> DsmError {
        DsmError::NoSuchPage { page: (i * 8 / crate::PAGE_BYTES) as u32, pages: self.0.len() * 8 / crate::PAGE_BYTES }
    }
}

impl Memory for Plain {
    #[inline]
    fn word(&mut self, i: usize) -> Result<u64, DsmError> {
        self.0.get(i).copied().ok_or_else(|| self.out_of_range(i))
    }
    #[inline]
    fn set_word(&mut self, i: usize, v: u64) -> Result<(), DsmError> {
        match self.0.get_mut(i) {
            Some(w) => {
                *w = v;
                Ok(())
            }
            None => Err(self.out_of_range(i)),
        }
    }
    fn read_words(&mut self, i: usize, out: &mut [u64]) -> Result<(), DsmError> {
        let src = i
            .checked_add(out.len())
            .and_then(|end| self.0.get(i..end))
            .ok_or_else(|| self.out_of_range(i + out.len()))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn write_words(&mut self, i: usize, words: &[u64]) -> Result<(), DsmError> {
        let e = i.saturating_add(words.len());
        let dst = i
            .checked_add(words.len())
            .and_then(|end| self.0.get_mut(i..end))
            .ok_or_else(|| DsmError::NoSuchPage { page: (e * 8 / crate::PAGE_BYTES) as u32, pages: 0 })?;
        dst.copy_from_slice(words);
        Ok(())
    }
    fn barrier(&mut self) -> Result<(), DsmError> {
        Ok(())
    }
    fn lock(&mut self, _l: usize) -> Result<(), DsmError> {
        Ok(())
    }
    fn unlock(&mut self, _l: usize) -> Result<(), DsmError> {
        Ok(())
    }
    fn rank(&self) -> usize {
        0
    }
    fn ranks(&self) -> usize {
        1
    }
}

/// The byte offset of word `i`.
#[inline]
fn offset(i: usize) -> Result<usize, DsmError> {
    i.checked_mul(8).ok_or(DsmError::Misaligned { at: usize::MAX })
}

impl Memory for SharedMemory {
    #[inline]
    fn word(&mut self, i: usize) -> Result<u64, DsmError> {
        self.range().read_u64(offset(i)?)
    }
    #[inline]
    fn set_word(&mut self, i: usize, v: u64) -> Result<(), DsmError> {
        self.range().write_u64(offset(i)?, v)
    }
    fn read_words(&mut self, i: usize, out: &mut [u64]) -> Result<(), DsmError> {
        self.range().read_words(offset(i)?, out)
    }
    fn write_words(&mut self, i: usize, words: &[u64]) -> Result<(), DsmError> {
        self.range().write_words(offset(i)?, words)
    }
    fn prefetch(&mut self, spans: &[(usize, usize)]) -> Result<(), DsmError> {
        let bytes: Vec<(usize, usize)> =
            spans.iter().map(|&(i, n)| Ok((offset(i)?, offset(n)?))).collect::<Result<_, DsmError>>()?;
        self.range().prefetch(&bytes)
    }
    fn barrier(&mut self) -> Result<(), DsmError> {
        SharedMemory::barrier(self)
    }
    fn lock(&mut self, l: usize) -> Result<(), DsmError> {
        SharedMemory::lock(self, l)
    }
    fn unlock(&mut self, l: usize) -> Result<(), DsmError> {
        SharedMemory::unlock(self, l)
    }
    fn rank(&self) -> usize {
        SharedMemory::rank(self)
    }
    fn ranks(&self) -> usize {
        self.size()
    }
}
