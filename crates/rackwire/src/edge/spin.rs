//! How long the network thread keeps looking after work before it sleeps: long enough to see
//! the answer to what it sent, when answers have lately come that soon.
//!
//! A thread that sleeps pays for a wake-up when the next frame comes (the sender's system
//! call wakes it, and on a virtual machine that is an interrupt between cores); one that keeps
//! looking pays for the core it holds. After a frame goes out, the next one in is most often
//! its answer (a ping-pong, a request and its reply, a window's acknowledgements), and how
//! long that took last time says how long it will take next: the spin covers it, with a
//! margin, up to [`NET_SPIN_MAX`]. Answers slower than that, or no answers at all (a one-way
//! stream keeps the thread busy anyway), leave the spin at [`NET_SPIN`].

use std::time::{Duration, Instant};

/// The spin after work when answers come late or not at all.
pub(super) const NET_SPIN: Duration = Duration::from_micros(50);
/// The longest spin: answers slower than this are waited for asleep.
pub(super) const NET_SPIN_MAX: Duration = Duration::from_micros(200);
/// The spin is this many quarters of the answers' recent time (a margin for their spread).
const MARGIN_QUARTERS: u32 = 5;

/// The spin's length, learned from when answers came.
#[derive(Debug)]
pub(super) struct Spin {
    /// When the last frame went out, until the next one came in.
    sent_at: Option<Instant>,
    /// The answers' recent time (a moving average; a quarter weight on the newest), if they
    /// have come within [`NET_SPIN_MAX`] lately.
    answer: Option<Duration>,
}

impl Spin {
    pub(super) fn new() -> Spin {
        Spin { sent_at: None, answer: None }
    }

    /// Frames went out at `at` (the answer's time counts from the first of a run).
    pub(super) fn sent(&mut self, at: Instant) {
        self.sent_at.get_or_insert(at);
    }

    /// Frames came in at `at`: the first since frames went out is taken as their answer.
    pub(super) fn received(&mut self, at: Instant) {
        let Some(sent) = self.sent_at.take() else { return };
        let took = at.saturating_duration_since(sent);
        self.answer = if took > NET_SPIN_MAX {
            // A late answer: the next ones are waited for asleep, until one comes sooner.
            None
        } else {
            Some(self.answer.map_or(took, |a| (a * 3 + took) / 4))
        };
    }

    /// How long to keep looking after the last piece of work.
    pub(super) fn length(&self) -> Duration {
        self.answer.map_or(NET_SPIN, |a| (a * MARGIN_QUARTERS / 4).clamp(NET_SPIN, NET_SPIN_MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    // Checks the spin's length against answers of known times: the default with no answers
    // yet; grown to cover answers that take 120 µs (with its margin, 150); never below the
    // default for fast answers nor above the cap for answers just under it; back to the
    // default after an answer slower than the cap; and a frame that comes in with nothing sent
    // before it (a peer's own traffic) changes nothing.
    #[test]
    fn the_spin_covers_answers_that_come_soon_and_only_those() {
        let t0 = Instant::now();
        let mut s = Spin::new();
        assert_eq!(s.length(), NET_SPIN);
        s.received(t0 + us(10));
        assert_eq!(s.length(), NET_SPIN, "nothing was sent: not an answer");
        for k in 0..20u64 {
            let at = t0 + us(1_000 * (k + 1));
            s.sent(at);
            s.sent(at + us(5));
            s.received(at + us(120));
        }
        let grown = s.length();
        assert!(grown >= us(145) && grown <= us(150), "{grown:?}");
        for k in 0..20u64 {
            let at = t0 + us(100_000 + 1_000 * k);
            s.sent(at);
            s.received(at + us(8));
        }
        assert_eq!(s.length(), NET_SPIN, "fast answers keep the default");
        for k in 0..20u64 {
            let at = t0 + us(200_000 + 1_000 * k);
            s.sent(at);
            s.received(at + us(190));
        }
        assert_eq!(s.length(), NET_SPIN_MAX, "capped");
        let at = t0 + us(300_000);
        s.sent(at);
        s.received(at + us(900));
        assert_eq!(s.length(), NET_SPIN, "a late answer ends the long spin");
    }
}
