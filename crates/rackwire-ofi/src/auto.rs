//! Automatic progress (`FI_PROGRESS_AUTO`): while a domain opened with it is open, a thread of
//! the provider's makes progress on its own — takes messages from the fabric and matches them,
//! serves the RMA and atomics aimed at this process, pushes queued sends — sleeping on the
//! fabric's doorbell between rounds. A target then need not call into libfabric for its memory
//! to be reached, and a sender's large message moves while the application computes. The
//! application's own calls still make progress too.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the thread drives (the provider): a round of progress, and a sleep until input may
/// wait.
pub(crate) trait Progress: Send + Sync + 'static {
    /// A round of progress; whether sends wait for room (so the next should come soon).
    fn round(&self) -> bool;
    /// Sleep until input may wait, at most `d`.
    fn wait_input(&self, d: Duration);
}

/// How long the thread sleeps at most between rounds when nothing waits to go (it wakes at
/// once when input arrives: the doorbell rings).
const IDLE_SLICE: Duration = Duration::from_millis(10);
/// How long it sleeps while sends wait for room in a peer's ring (a peer draining its ring
/// rings no bell here).
const BUSY_SLICE: Duration = Duration::from_micros(100);

/// The running thread.
pub(crate) struct AutoProgress {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl AutoProgress {
    /// Start the thread for `p` (it holds `p` only while it makes a round).
    pub(crate) fn start<P: Progress>(p: &Arc<P>) -> std::io::Result<AutoProgress> {
        let (weak, stop) = (Arc::downgrade(p), Arc::new(AtomicBool::new(false)));
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("rw-ofi-progress".into()).spawn(move || run(&weak, &flag))?;
        Ok(AutoProgress { stop, thread })
    }

    /// Stop the thread and wait for it (at most one sleep, [`IDLE_SLICE`]).
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}

fn run<P: Progress>(weak: &Weak<P>, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        let Some(p) = weak.upgrade() else { return };
        let slice = if p.round() { BUSY_SLICE } else { IDLE_SLICE };
        p.wait_input(slice);
    }
}
