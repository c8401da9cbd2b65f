//! What application threads and the network thread tell each other without the endpoint's
//! lock, and the decisions they take from it.
//!
//! Each field is one word read and written on its own (atomics in the threaded runtime; the
//! simulator runs the same code from one thread). Every method takes the time it acts at.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::limits::{PUMP_RECENT_US, PUMP_WATCH_MAX_US, PUMP_WATCH_US, QUIET_AFTER_US};
use crate::Time;

/// The park deadline a [`HandOff`] holds while the network thread is awake.
pub const AWAKE: Time = 0;

/// What a receiving look of an application thread does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppLook {
    /// Run a round (the transport is in use).
    Round,
    /// Leave the links to the network thread (the transport has been quiet, see
    /// [`QUIET_AFTER_US`]); wake it when `wake` (it only watched this thread).
    Quiet {
        /// The network thread must be woken.
        wake: bool,
    },
}

/// The hand-off state of one endpoint.
#[derive(Debug)]
pub struct HandOff {
    /// When an application thread last polled, or 0 once it stopped to sleep.
    last_pump: AtomicU64,
    /// When frames last came in or an operation was last submitted.
    last_busy: AtomicU64,
    /// The network thread leaves the links to a polling application thread and only looks now
    /// and then whether it still polls.
    watching: AtomicBool,
    /// The first and the longest look interval while watching: [`PUMP_WATCH_US`] and
    /// [`PUMP_WATCH_MAX_US`] (a test lengthens them).
    watch: [AtomicU64; 2],
    /// Until when the network thread sleeps, or [`AWAKE`]: a submission that needs it sooner
    /// (a timer) wakes it.
    parked_until: AtomicU64,
    /// An application thread left operations unsent for the next round: the network thread's
    /// spin ends for them.
    gathered: AtomicBool,
}

impl Default for HandOff {
    fn default() -> Self {
        HandOff::new()
    }
}

impl HandOff {
    /// Nobody polling, the transport quiet, the network thread awake.
    pub fn new() -> HandOff {
        HandOff {
            last_pump: AtomicU64::new(0),
            last_busy: AtomicU64::new(0),
            watching: AtomicBool::new(false),
            watch: [AtomicU64::new(PUMP_WATCH_US), AtomicU64::new(PUMP_WATCH_MAX_US)],
            parked_until: AtomicU64::new(AWAKE),
            gathered: AtomicBool::new(false),
        }
    }

    /// The transport is in use at `now`: a frame came in or an operation was submitted.
    pub fn busy(&self, now: Time) {
        self.last_busy.store(now, Ordering::Relaxed);
    }

    /// No frame came in and no operation was submitted for [`QUIET_AFTER_US`] before `now`.
    pub fn quiet_at(&self, now: Time) -> bool {
        now.saturating_sub(self.last_busy.load(Ordering::Relaxed)) > QUIET_AFTER_US
    }

    /// An application thread polls at `now` (it ran a round, or found the lock taken).
    pub fn polled(&self, now: Time) {
        // 0 stands for "rested".
        self.last_pump.store(now.max(1), Ordering::Relaxed);
    }

    /// An application thread polled within [`PUMP_RECENT_US`] of `now` (and did not rest
    /// since).
    pub fn polled_lately(&self, now: Time) -> bool {
        let last = self.last_pump.load(Ordering::SeqCst);
        last != 0 && now.saturating_sub(last) < PUMP_RECENT_US
    }

    /// Some thread ran a round at this very `now`: a receiver looking at many peers of one
    /// endpoint drives it once per look, not once per peer.
    pub fn polled_at(&self, now: Time) -> bool {
        self.last_pump.load(Ordering::Relaxed) == now.max(1)
    }

    /// An application thread stops polling (it is about to sleep). True when the network
    /// thread must be woken: it only watches, and would look again only after up to
    /// [`PUMP_WATCH_MAX_US`].
    #[must_use]
    pub fn rest(&self) -> bool {
        self.last_pump.store(0, Ordering::SeqCst);
        self.watching.load(Ordering::SeqCst)
    }

    /// What a receiving look of an application thread does at `now`.
    #[must_use]
    pub fn app_look(&self, now: Time) -> AppLook {
        if !self.quiet_at(now) {
            return AppLook::Round;
        }
        // Said once: a thread still marked as polling stops being so.
        let wake = self.last_pump.load(Ordering::Relaxed) != 0 && self.rest();
        AppLook::Quiet { wake }
    }

    /// An operation was submitted at `now` on a connection for which a frame of its own would
    /// be a waste (`worth_gathering`: small, with frames in flight). True when it is left
    /// gathered for whoever drives the endpoint next, which sends the operations gathered
    /// meanwhile several to a frame: a thread that polls (most likely the submitter; one that
    /// stops to sleep hands over at once), or the network thread when it is at work. False:
    /// send it now, from the submitting thread (the network thread sleeps, or only watches).
    /// (The submitter marks the transport [`HandOff::busy`] when it queues the operation.)
    #[must_use]
    pub fn submitted(&self, now: Time, worth_gathering: bool) -> bool {
        let gather = worth_gathering
            && (self.polled_lately(now)
                || (self.parked_until.load(Ordering::SeqCst) == AWAKE && !self.watching.load(Ordering::SeqCst)));
        if gather {
            self.gathered.store(true, Ordering::Release);
        }
        gather
    }

    /// Whether the network thread, asleep, must be woken for a deadline at `due`: it sleeps
    /// past it.
    pub fn wakes_for(&self, due: Option<Time>) -> bool {
        let parked = self.parked_until.load(Ordering::SeqCst);
        parked != AWAKE && due.is_some_and(|t| t < parked)
    }

    /// Operations wait gathered for the next round.
    pub fn gathered(&self) -> bool {
        self.gathered.load(Ordering::Acquire)
    }

    /// Whether operations wait gathered, said under the endpoint's lock by whoever runs a
    /// round or flushes.
    pub fn set_gathered(&self, gathered: bool) {
        self.gathered.store(gathered, Ordering::Relaxed);
    }

    /// The network thread starts or stops watching a polling application thread. Said before
    /// it looks again whether the thread polls: a thread that stops after that look sees the
    /// flag and wakes it ([`HandOff::rest`]).
    pub fn set_watching(&self, watching: bool) {
        self.watching.store(watching, Ordering::SeqCst);
    }

    /// The network thread watches a polling application thread.
    pub fn is_watching(&self) -> bool {
        self.watching.load(Ordering::SeqCst)
    }

    /// The network thread sleeps until `until` (or [`AWAKE`]).
    pub fn park_until(&self, until: Time) {
        self.parked_until.store(until, Ordering::SeqCst);
    }

    /// The first look interval while watching.
    pub fn watch_first(&self) -> Time {
        self.watch[0].load(Ordering::Relaxed)
    }

    /// The longest look interval while watching.
    pub fn watch_max(&self) -> Time {
        self.watch[1].load(Ordering::Relaxed)
    }

    /// Make the network thread's looks while an application thread polls `us` apart (a test
    /// holds the network thread off this way).
    pub fn set_watch(&self, us: Time) {
        for w in &self.watch {
            w.store(us, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks who drives when: a thread that polled within PUMP_RECENT_US counts as polling
    // (and a small operation is gathered for it), one that rested does not; an operation
    // submitted while the network thread only watches or sleeps goes at once; a thread that
    // rests wakes a watching network thread and not a sleeping one; a quiet transport sends
    // a receiving look away, once waking the watcher.
    #[test]
    fn the_hand_off_follows_who_polls() {
        let h = HandOff::new();
        h.polled(1_000);
        assert!(h.polled_lately(1_000 + PUMP_RECENT_US - 1));
        assert!(!h.polled_lately(1_000 + PUMP_RECENT_US));
        assert!(h.submitted(1_100, true), "gathered for the polling thread");
        assert!(h.gathered());
        assert!(!h.submitted(1_100, false), "a large operation goes at once");
        h.set_watching(true);
        assert!(h.rest(), "a watching network thread is woken");
        assert!(!h.submitted(1_200, true), "nobody polls and the network thread only watches");
        h.set_watching(false);
        h.park_until(5_000);
        assert!(!h.submitted(1_300, true), "the network thread sleeps");
        assert!(h.wakes_for(Some(4_000)) && !h.wakes_for(Some(6_000)) && !h.wakes_for(None));
        h.park_until(AWAKE);
        assert!(!h.wakes_for(Some(1)));
        assert!(!h.rest(), "a network thread that does not watch needs no wake-up");
        h.busy(10_000);
        assert_eq!(h.app_look(10_000 + QUIET_AFTER_US), AppLook::Round);
        h.polled(10_500);
        h.set_watching(true);
        assert_eq!(h.app_look(11_001 + QUIET_AFTER_US), AppLook::Quiet { wake: true });
        assert_eq!(h.app_look(11_002 + QUIET_AFTER_US), AppLook::Quiet { wake: false }, "said once");
    }
}
