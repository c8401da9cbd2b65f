//! What the network thread does between rounds: watch a polling application thread, run
//! another round at once, keep looking for a moment (the spin), or sleep until a deadline.
//!
//! A thread that sleeps pays for a wake-up when the next frame comes (the sender's system
//! call wakes it, and on a virtual machine that is an interrupt between cores); one that keeps
//! looking pays for the core it holds. After a frame goes out, the next one in is most often
//! its answer (a ping-pong, a request and its reply, a window's acknowledgements), and how
//! long that took last time says how long it will take next: the spin covers it, with a
//! margin, up to [`NET_SPIN_MAX_US`]. Answers slower than that, or no answers at all (a
//! one-way stream keeps the thread busy anyway), leave the spin at [`NET_SPIN_US`].

use super::limits::{IDLE_WAIT_MAX_US, NET_SPIN_MARGIN_QUARTERS, NET_SPIN_MAX_US, NET_SPIN_US};
use super::{HandOff, Worked};
use crate::Time;

/// What the network thread does before a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Before {
    /// An application thread polls: leave it the links and the core, and look again whether
    /// it still polls after this long (µs), unless woken.
    Watch(Time),
    /// Run a round.
    Round,
}

/// What the network thread does after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Another round at once.
    Again,
    /// Look (links and waker, without the endpoint's lock) until this time, a look that finds
    /// something, or operations gathered; then a round.
    Spin {
        /// The spin's end.
        until: Time,
    },
    /// Sleep until a frame comes, the waker is woken, or this time.
    Park {
        /// The sleep's end.
        until: Time,
    },
}

/// The spin's length, learned from when answers came.
#[derive(Debug, Default)]
pub struct Spin {
    /// When the last frame went out, until the next one came in.
    sent_at: Option<Time>,
    /// The answers' recent time (a moving average; a quarter weight on the newest), if they
    /// have come within [`NET_SPIN_MAX_US`] lately.
    answer: Option<Time>,
}

impl Spin {
    /// Frames went out at `at` (the answer's time counts from the first of a run).
    pub fn sent(&mut self, at: Time) {
        self.sent_at.get_or_insert(at);
    }

    /// Frames came in at `at`: the first since frames went out is taken as their answer.
    pub fn received(&mut self, at: Time) {
        let Some(sent) = self.sent_at.take() else { return };
        let took = at.saturating_sub(sent);
        self.answer = if took > NET_SPIN_MAX_US {
            // A late answer: the next ones are waited for asleep, until one comes sooner.
            None
        } else {
            Some(self.answer.map_or(took, |a| (a * 3 + took) / 4))
        };
    }

    /// How long to keep looking after the last piece of work.
    pub fn length(&self) -> Time {
        self.answer.map_or(NET_SPIN_US, |a| (a * NET_SPIN_MARGIN_QUARTERS / 4).clamp(NET_SPIN_US, NET_SPIN_MAX_US))
    }
}

/// How long the network thread may sleep at `now` with `next` the earliest deadline.
pub fn wait_for(next: Option<Time>, now: Time) -> Time {
    next.map_or(IDLE_WAIT_MAX_US, |t| t.saturating_sub(now).min(IDLE_WAIT_MAX_US))
}

/// The network thread's own state.
#[derive(Debug)]
pub struct NetThread {
    /// The look interval while watching a polling application thread.
    watch: Time,
    /// When it last did work (received or sent).
    last_work: Time,
    /// How long it keeps looking after work.
    pub spin: Spin,
    /// A spin of this length instead of the learned one.
    spin_fixed: Option<Time>,
}

impl NetThread {
    /// A network thread at `now` that has not worked yet.
    pub fn new(hand: &HandOff, now: Time) -> NetThread {
        NetThread { watch: hand.watch_first(), last_work: now, spin: Spin::default(), spin_fixed: None }
    }

    /// Spin `us` after work whatever answers do (0: sleep at once), or, with `None`, as long as
    /// answers lately took ([`Spin`]).
    pub fn fix_spin(&mut self, us: Option<Time>) {
        self.spin_fixed = us;
    }

    /// Before a round at `now`: watch a polling application thread, or run the round. The
    /// caller marks itself watching ([`HandOff::set_watching`]) and asks again
    /// ([`HandOff::polled_lately`]) before it sleeps for [`Before::Watch`]'s time, and calls
    /// [`NetThread::watched`] after.
    pub fn before_round(&mut self, hand: &HandOff, now: Time, stopping: bool) -> Before {
        if !stopping && hand.polled_lately(now) {
            Before::Watch(self.watch)
        } else {
            self.watch = hand.watch_first();
            Before::Round
        }
    }

    /// A watch ended with the application thread still polling: the next look comes twice as
    /// late, up to [`HandOff::watch_max`].
    pub fn watched(&mut self, hand: &HandOff) {
        self.watch = (self.watch * 2).min(hand.watch_max());
    }

    /// A round ended at `now`, having done `w`.
    pub fn worked(&mut self, now: Time, w: Worked) {
        if w.got > 0 {
            self.spin.received(now);
        }
        if w.sent > 0 {
            self.spin.sent(now);
        }
        if w.got + w.sent > 0 {
            self.last_work = now;
        }
    }

    /// Something else was done at `now` that an answer will follow (frames sent outside a
    /// round).
    pub fn answered(&mut self, now: Time) {
        self.last_work = now;
        self.spin.sent(now);
    }

    /// When the spin after the last work ends.
    pub fn spin_end(&self) -> Time {
        self.last_work + self.spin_fixed.unwrap_or_else(|| self.spin.length())
    }

    /// After a round that did `w` at `now`, with `next` the earliest deadline: another round
    /// at once after work (`again` says whether the work calls for one, see the caller),
    /// once an application thread polls again, the spin while the last work is recent, else
    /// a sleep until `next` (at most [`IDLE_WAIT_MAX_US`]).
    pub fn after_round(&self, hand: &HandOff, now: Time, w: Worked, again: bool, next: Option<Time>) -> After {
        let idle = w.got + w.sent == 0;
        if (!idle && again) || (idle && hand.polled_lately(now)) {
            return After::Again;
        }
        let wake = now + wait_for(next, now);
        let spin_end = self.spin_end();
        if now < spin_end {
            After::Spin { until: spin_end.min(wake) }
        } else {
            After::Park { until: wake }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the spin's length against answers of known times: the default with no answers
    // yet; grown to cover answers that take 120 µs (with its margin, 150); never below the
    // default for fast answers nor above the cap for answers just under it; back to the
    // default after an answer slower than the cap; and a frame that comes in with nothing sent
    // before it (a peer's own traffic) changes nothing.
    #[test]
    fn the_spin_covers_answers_that_come_soon_and_only_those() {
        let mut s = Spin::default();
        assert_eq!(s.length(), NET_SPIN_US);
        s.received(10);
        assert_eq!(s.length(), NET_SPIN_US, "nothing was sent: not an answer");
        for k in 0..20 {
            let at = 1_000 * (k + 1);
            s.sent(at);
            s.sent(at + 5);
            s.received(at + 120);
        }
        let grown = s.length();
        assert!((145..=150).contains(&grown), "{grown}");
        for k in 0..20 {
            let at = 100_000 + 1_000 * k;
            s.sent(at);
            s.received(at + 8);
        }
        assert_eq!(s.length(), NET_SPIN_US, "fast answers keep the default");
        for k in 0..20 {
            let at = 200_000 + 1_000 * k;
            s.sent(at);
            s.received(at + 190);
        }
        assert_eq!(s.length(), NET_SPIN_MAX_US, "capped");
        s.sent(300_000);
        s.received(300_900);
        assert_eq!(s.length(), NET_SPIN_US, "a late answer ends the long spin");
    }

    // Checks the network thread's steps: it watches a thread that polled lately, at intervals
    // that double up to the longest; after work that calls for it, another round; idle with
    // work just done, the spin (never past a deadline); idle long after work, a sleep until
    // the deadline, at most IDLE_WAIT_MAX_US; idle while a thread polls again, a round (which
    // then leads to the watch).
    #[test]
    fn the_network_thread_watches_works_spins_and_sleeps() {
        let hand = HandOff::new();
        let mut net = NetThread::new(&hand, 0);
        hand.polled(1_000);
        assert_eq!(net.before_round(&hand, 1_010, false), Before::Watch(hand.watch_first()));
        net.watched(&hand);
        assert_eq!(net.before_round(&hand, 1_020, false), Before::Watch(hand.watch_first() * 2));
        for _ in 0..10 {
            net.watched(&hand);
        }
        assert_eq!(net.before_round(&hand, 1_030, false), Before::Watch(hand.watch_max()));
        assert_eq!(net.before_round(&hand, 1_030, true), Before::Round, "stopping: one last round");
        assert_eq!(net.before_round(&hand, 2_000, false), Before::Round);
        assert_eq!(net.before_round(&hand, 1_030, false), Before::Watch(hand.watch_first()), "back to the first");
        let w = Worked { got: 1, sent: 1 };
        net.worked(2_000, w);
        assert_eq!(net.after_round(&hand, 2_000, w, true, None), After::Again);
        assert_eq!(net.after_round(&hand, 2_000, w, false, None), After::Spin { until: 2_000 + NET_SPIN_US });
        let idle = Worked::default();
        assert_eq!(net.after_round(&hand, 2_010, idle, false, Some(2_020)), After::Spin { until: 2_020 });
        assert_eq!(net.after_round(&hand, 3_000, idle, false, Some(3_500)), After::Park { until: 3_500 });
        assert_eq!(net.after_round(&hand, 3_000, idle, false, None), After::Park { until: 3_000 + IDLE_WAIT_MAX_US });
        hand.polled(3_000);
        assert_eq!(net.after_round(&hand, 3_000, idle, false, None), After::Again);
    }

    // Checks a fixed spin: at 0 the network thread sleeps right after work (until the
    // deadline), at 30 µs it spins exactly that long whatever answers did, and with none it
    // learns again.
    #[test]
    fn a_fixed_spin_overrides_the_learned_one() {
        let hand = HandOff::new();
        let mut net = NetThread::new(&hand, 0);
        let w = Worked { got: 1, sent: 1 };
        net.fix_spin(Some(0));
        net.worked(1_000, w);
        assert_eq!(net.after_round(&hand, 1_000, w, false, Some(1_500)), After::Park { until: 1_500 });
        net.fix_spin(Some(30));
        assert_eq!(net.after_round(&hand, 1_000, w, false, None), After::Spin { until: 1_030 });
        net.fix_spin(None);
        assert_eq!(net.after_round(&hand, 1_000, w, false, None), After::Spin { until: 1_000 + NET_SPIN_US });
    }
}
