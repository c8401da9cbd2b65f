//! How a rank waits for its peers: spin, then yield, then sleep, never past a deadline.
//!
//! A rank that has nothing to do first looks again at once (spinning, and driving the edge
//! transport if there is one), because over shared memory the peer's word usually arrives
//! within a microsecond. When the group has more ranks than this machine has cores, spinning
//! would take the core from the rank it waits for, so such a rank yields its core at every
//! look instead. After [`YIELD_PHASE`] it sleeps between looks, a little longer each time (up
//! to [`SLEEP_MAX`]), so a rank waiting for a slow peer costs next to no CPU.

use std::time::{Duration, Instant};

/// Looks a rank spins before it starts yielding (when it has a core to itself).
pub(crate) const SPIN_LOOKS: u32 = 20_000;
/// How long a rank keeps yielding between looks before it starts sleeping.
pub(crate) const YIELD_PHASE: Duration = Duration::from_millis(2);
/// The first sleep between looks.
pub(crate) const SLEEP_MIN: Duration = Duration::from_micros(20);
/// The longest sleep between looks (how late a sleeping rank sees its peer's word, at worst).
pub(crate) const SLEEP_MAX: Duration = Duration::from_micros(500);
/// How often, while waiting, a rank checks that the ranks it waits for are still alive.
pub(crate) const LIVENESS_EVERY: Duration = Duration::from_millis(5);
/// How often, while waiting, a rank asks the management host which ranks are down (it hears
/// of a process's end at once, from its session; a transport may take longer).
pub(crate) const MH_CHECK_EVERY: Duration = Duration::from_millis(250);

/// What to do after a look that found nothing.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Idle {
    /// Look again.
    Again,
    /// Time to check that the peers are alive (then look again).
    CheckPeers {
        /// Also ask the management host.
        ask_mh: bool,
    },
    /// The deadline passed.
    TimedOut,
}

/// One wait of one group call.
pub(crate) struct Waiter {
    /// When the first look that read the clock was made (a wait that ends while spinning
    /// never reads it).
    start: Option<Instant>,
    timeout: Duration,
    looks: u32,
    oversubscribed: bool,
    sleep: Duration,
    next_check: Duration,
    next_mh: Duration,
    rested: bool,
}

impl Waiter {
    pub(crate) fn new(timeout: Duration, oversubscribed: bool) -> Waiter {
        Waiter {
            start: None,
            timeout,
            looks: 0,
            oversubscribed,
            sleep: SLEEP_MIN,
            next_check: LIVENESS_EVERY,
            next_mh: MH_CHECK_EVERY,
            rested: false,
        }
    }

    /// How long this wait has lasted.
    pub(crate) fn waited(&self) -> Duration {
        self.start.map_or(Duration::ZERO, |s| s.elapsed())
    }

    /// Something moved: the next idle look starts spinning again.
    pub(crate) fn progressed(&mut self) {
        self.looks = 0;
        self.sleep = SLEEP_MIN;
    }

    /// A look found nothing: spin, yield or sleep as the module documentation says. `rest` is
    /// called once before the first sleep (the transport's own thread takes over).
    pub(crate) fn idle(&mut self, rest: impl FnOnce()) -> Idle {
        self.looks = self.looks.saturating_add(1);
        let spinning = !self.oversubscribed && self.looks < SPIN_LOOKS;
        // While spinning, the clock is read every 64th look only.
        if spinning && !self.looks.is_multiple_of(64) {
            std::hint::spin_loop();
            return Idle::Again;
        }
        let waited = self.start.get_or_insert_with(Instant::now).elapsed();
        if waited >= self.timeout {
            return Idle::TimedOut;
        }
        if waited >= self.next_check {
            self.next_check = waited + LIVENESS_EVERY;
            let ask_mh = waited >= self.next_mh;
            if ask_mh {
                self.next_mh = waited + MH_CHECK_EVERY;
            }
            return Idle::CheckPeers { ask_mh };
        }
        if spinning {
            return Idle::Again;
        }
        if self.oversubscribed || waited < YIELD_PHASE {
            std::thread::yield_now();
            if waited < YIELD_PHASE {
                return Idle::Again;
            }
        }
        if !self.rested {
            self.rested = true;
            rest();
        }
        std::thread::sleep(self.sleep);
        self.sleep = (self.sleep * 2).min(SLEEP_MAX);
        Idle::Again
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the waiter's schedule: it asks for a liveness check within a few periods, rests
    // the transport once before sleeping, and times out at its deadline (not before).
    #[test]
    fn checks_rests_once_and_times_out() {
        let mut w = Waiter::new(Duration::from_millis(60), true);
        let mut rests = 0;
        let mut checks = 0;
        let outcome = loop {
            match w.idle(|| rests += 1) {
                Idle::Again => {}
                Idle::CheckPeers { .. } => checks += 1,
                Idle::TimedOut => break w.waited(),
            }
        };
        assert!(outcome >= Duration::from_millis(60), "timed out early: {outcome:?}");
        assert!(checks >= 2, "checked the peers {checks} times in 60 ms");
        assert_eq!(rests, 1, "rested once");
    }
}
