//! Applications of the shared memory, SPLASH-2's algorithms written anew: each runs over any
//! [`Memory`] (a job's shared range, or one process's plain memory, against which every shared
//! run is checked) with its ranks splitting the work and a barrier between phases.

pub mod lu;

use crate::{DsmError, SharedMemory};

/// Words of memory the ranks share, and a barrier.
pub trait Memory {
    /// The word at index `i`.
    fn get(&mut self, i: usize) -> Result<f64, DsmError>;
    /// Set the word at index `i`.
    fn set(&mut self, i: usize, v: f64) -> Result<(), DsmError>;
    /// Every rank's writes before it are seen by every rank after it.
    fn barrier(&mut self) -> Result<(), DsmError>;
    /// This rank, and the ranks.
    fn rank(&self) -> usize;
    /// Ranks sharing the memory.
    fn ranks(&self) -> usize;
}

/// One process's memory: one rank, whose barrier is nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Plain(pub Vec<f64>);

impl Memory for Plain {
    fn get(&mut self, i: usize) -> Result<f64, DsmError> {
        self.0.get(i).copied().ok_or(DsmError::NoSuchPage { page: (i * 8 / crate::PAGE_BYTES) as u32, pages: 0 })
    }
    fn set(&mut self, i: usize, v: f64) -> Result<(), DsmError> {
        let pages = self.0.len() * 8 / crate::PAGE_BYTES;
        let w = self.0.get_mut(i).ok_or(DsmError::NoSuchPage { page: (i * 8 / crate::PAGE_BYTES) as u32, pages })?;
        *w = v;
        Ok(())
    }
    fn barrier(&mut self) -> Result<(), DsmError> {
        Ok(())
    }
    fn rank(&self) -> usize {
        0
    }
    fn ranks(&self) -> usize {
        1
    }
}

impl Memory for SharedMemory {
    fn get(&mut self, i: usize) -> Result<f64, DsmError> {
        Ok(f64::from_bits(self.range().read_u64(i * 8)?))
    }
    fn set(&mut self, i: usize, v: f64) -> Result<(), DsmError> {
        self.range().write_u64(i * 8, v.to_bits())
    }
    fn barrier(&mut self) -> Result<(), DsmError> {
        SharedMemory::barrier(self)
    }
    fn rank(&self) -> usize {
        SharedMemory::rank(self)
    }
    fn ranks(&self) -> usize {
        self.size()
    }
}
