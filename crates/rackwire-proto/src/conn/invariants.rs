//! What must hold between any two steps of a connection, checked after every input, timeout
//! and output, as TigerBeetle asserts its invariants: a broken one stops the run at the step
//! that broke it, not many steps later where its effects show. The bounds, a few comparisons,
//! hold in every build; the accounting of each frame in flight, which walks them all, in debug
//! builds (the test suite, the fuzz targets and the simulator run them).

use super::loss::RETX_WATCH_MAX;
use super::{Connection, State};
use crate::{STASH_BYTES_MAX, WINDOW_FRAMES_MAX};

impl Connection {
    /// Panics if an invariant does not hold (the walks over every frame in flight in debug
    /// builds only).
    pub(super) fn check_invariants(&self) {
        self.assert_bounds();
        if cfg!(debug_assertions) {
            self.assert_accounting();
        }
    }

    /// The bounds and orders that take a few comparisons: on in release.
    fn assert_bounds(&self) {
        // Windows and queues within their bounds.
        assert!(
            self.inflight.len() <= self.cfg.window_frames_max.min(WINDOW_FRAMES_MAX),
            "frames in flight past the window"
        );
        assert!(self.retx_watch.len() <= RETX_WATCH_MAX, "lost frames remembered past the bound");
        assert!(self.incoming.stashed_bytes() <= STASH_BYTES_MAX, "early fragments stashed past the bound");
        // Sequence numbers: every frame in flight was sent.
        if let Some(first) = self.inflight.first_seq() {
            assert!(first < self.next_seq, "a frame in flight was never sent");
        }
        // A closed connection holds nothing in flight.
        if matches!(self.state, State::Closed(_)) {
            assert!(self.inflight.is_empty() && self.retx.is_empty(), "a closed connection holds frames");
        }
    }

    /// Each frame in flight accounted for: walks them all, so debug builds only.
    fn assert_accounting(&self) {
        // Each link counts exactly the frames in flight that count against it, and lists each
        // of them in its send order.
        for (l, link) in self.links.iter().enumerate() {
            let counted = self.inflight.iter().filter(|(_, s)| s.counted_on == Some(l)).count();
            assert_eq!(link.inflight, counted, "link {l} counts {} frames in flight, {counted} are", link.inflight);
            for (seq, s) in self.inflight.iter().filter(|(_, s)| s.counted_on == Some(l)) {
                assert!(
                    link.sent_order.contains(&(seq, s.sent_at)),
                    "frame {seq} counts against link {l} but is not in its send order"
                );
            }
            assert!(link.window() >= 1, "link {l}'s window is empty");
        }
        // A frame queued to go again is one in flight that no link counts.
        for &seq in &self.retx {
            if let Some(s) = self.inflight.get(seq) {
                assert!(s.counted_on.is_none(), "frame {seq} is queued to go again while a link counts it");
            }
        }
    }
}
