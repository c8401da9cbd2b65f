//! One round of work on an endpoint: take in what arrived, hand it over, fire timers, send.
//! The decisions are here; the I/O is the [`RoundHost`]'s.

use super::limits::ANSWER_HOLD_US;
use super::HandOff;
use crate::{earliest, Endpoint, Time};

/// What a round's receiving did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    /// Frames taken.
    pub frames: usize,
    /// Frames may still wait on some link (a burst's worth was taken, or the receiving
    /// stopped at a frame with something to hand over).
    pub more: bool,
}

/// What a round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Worked {
    /// Frames received.
    pub got: usize,
    /// Frames sent.
    pub sent: usize,
}

/// The I/O and the hand-over of one round, as a driver of an endpoint does them: its links,
/// its memory, what it does with completed operations, messages and notifications.
pub trait RoundHost<A, P> {
    /// Read the links and feed every frame to `conns`. With `stop_at_event`, stop after the
    /// first frame that gives a connection something to hand over (and say `more`): it is
    /// most likely alone (a ping-pong's) and goes to whoever waits for it first.
    fn receive(&mut self, conns: &mut Endpoint<A, P>, now: Time, stop_at_event: bool) -> Received;

    /// Hand over what the connections did ([`Endpoint::poll`] with `hold`). True when a
    /// message or notification went to a thread that waits for it, or a signal landed.
    fn dispatch(&mut self, conns: &mut Endpoint<A, P>, hold: Option<Time>) -> bool;

    /// Messages go to a handler as they arrive, from whichever thread runs the round (a
    /// virtual NIC's), rather than waiting to be taken.
    fn relays(&self) -> bool {
        false
    }

    /// The last dispatch took messages for that handler.
    fn relayed(&self) -> bool {
        false
    }

    /// Fire due timers (and whatever else is looked at with them, such as connections that
    /// cannot reach their peer). Says whether one fired, and the earliest deadline of the
    /// others.
    fn timeouts(&mut self, conns: &mut Endpoint<A, P>, now: Time) -> (bool, Option<Time>);

    /// Send what every connection has to send. Returns the frames sent.
    fn transmit(&mut self, conns: &mut Endpoint<A, P>, now: Time) -> usize;
}

/// Whether a connection owes a frame at once (an acknowledgement, a close).
fn owed<A: Copy + std::hash::Hash, P>(conns: &Endpoint<A, P>) -> bool {
    conns.sessions().any(|s| s.conn().owes_now())
}

/// Whether a round that hands over what it took (`frames` of them) may end early though the
/// round before did too: only for a lone frame (a ping-pong's, not a stream's: a stream whose
/// rounds end early in a row goes to the spin without a look at its links, and loses rate),
/// while nothing waits for a whole round (no operation gathered to send and no frame owed at
/// once, `waiting` false; no deadline known to have passed, `due`), and the last whole round
/// ran (at `whole_at`) less than [`ANSWER_HOLD_US`] before `now`: an answer held, or a
/// deadline moved earlier since `due` was taken, waits no longer than a hold.
pub fn may_end_early_again(frames: usize, waiting: bool, now: Time, whole_at: Time, due: Option<Time>) -> bool {
    frames == 1 && !waiting && now < whole_at + ANSWER_HOLD_US && due.is_none_or(|t| t > now)
}

/// The state rounds keep between them (under the endpoint's lock).
#[derive(Debug)]
pub struct Rounds {
    /// The last round ended early, right after handing over what it took.
    shortcut: bool,
    /// When the last round that did not end early ran: rounds end early in a row only within
    /// [`ANSWER_HOLD_US`] of it.
    whole_at: Time,
    /// Operations were gathered, unsent: the next round sends them.
    unsent: bool,
    /// The last round found every link empty.
    quiet: bool,
    /// No connection has anything due before this, unless `stale`: an idle round (the polling
    /// loop's usual one) then skips the look at every connection's timers.
    due: Option<Time>,
    /// Something may have moved a deadline earlier since `due` was taken.
    stale: bool,
}

impl Default for Rounds {
    fn default() -> Self {
        Rounds::new()
    }
}

impl Rounds {
    /// Before the first round: everything is to be looked at.
    pub fn new() -> Rounds {
        Rounds { shortcut: false, whole_at: 0, unsent: false, quiet: true, due: None, stale: true }
    }

    /// Something may have moved a deadline earlier (a connection opened or closed).
    pub fn touch(&mut self) {
        self.stale = true;
    }

    /// An operation was submitted at `now` on a connection for which a frame of its own would
    /// be a waste or not (`worth_gathering`). True when the submitting thread sends it now;
    /// false when it is left gathered for the next round (see [`HandOff::submitted`]).
    #[must_use]
    pub fn submitted(&mut self, hand: &HandOff, now: Time, worth_gathering: bool) -> bool {
        let gather = hand.submitted(now, worth_gathering);
        self.unsent |= gather;
        !gather
    }

    /// After a submission, its connection's next deadline is `due` (no other's moved): true
    /// when the network thread must be woken for it (it sleeps past it).
    #[must_use]
    pub fn armed(&mut self, hand: &HandOff, due: Option<Time>) -> bool {
        self.due = earliest(self.due, due);
        hand.wakes_for(due)
    }

    /// Take the gathered operations for a send now (a flush): true when there were some.
    pub fn take_unsent(&mut self, hand: &HandOff) -> bool {
        hand.set_gathered(false);
        let unsent = std::mem::take(&mut self.unsent);
        if unsent {
            // The next round looks at the connections (timers the frames arm).
            self.stale = true;
        }
        unsent
    }

    /// The last round ended early (it handed over what it took and did nothing else).
    pub fn ended_early(&self) -> bool {
        self.shortcut
    }

    /// The earliest deadline of any connection.
    pub fn next_due<A: Copy + std::hash::Hash, P>(&mut self, conns: &Endpoint<A, P>) -> Option<Time> {
        if self.stale {
            self.due = conns.next_timeout();
            self.stale = false;
        }
        self.due
    }

    /// When the network thread must run its next round: the earliest deadline, except after a
    /// round that ended early, which needs none looked up (the next one ends early too only
    /// before the deadline known before it, see [`may_end_early_again`]).
    pub fn next_round_due<A: Copy + std::hash::Hash, P>(&mut self, conns: &Endpoint<A, P>) -> Option<Time> {
        if self.shortcut {
            self.due
        } else {
            self.next_due(conns)
        }
    }

    /// One round at `now`. `app`: an application thread runs it (polling while it waits), and
    /// answers to what it hands that thread are held for the reply it is likely to send next.
    pub fn run<A: Copy + std::hash::Hash, P, H: RoundHost<A, P>>(
        &mut self,
        hand: &HandOff,
        host: &mut H,
        conns: &mut Endpoint<A, P>,
        now: Time,
        app: bool,
    ) -> Worked {
        // A hold lasts until the next round: whoever runs it, the reply did not come first.
        let released = conns.release_holds();
        // After a round that found every link empty, a frame that gives a connection something
        // to hand over is most likely alone (a ping-pong): it ends the receiving and is handed
        // over before the look that would find its link empty (a system call). The next
        // round, which follows at once, reads every link to the end.
        let Received { frames: got, more } = host.receive(conns, now, self.quiet);
        self.quiet = got == 0;
        if got > 0 {
            hand.busy(now);
        }
        // Timers (and loss detection) wait while frames are still queued: after a stall, the
        // acknowledgements not yet read would otherwise make frames look lost. Connections are
        // looked at only when frames arrived, something changed, or a deadline passed.
        let look = !more && (got > 0 || self.stale || self.due.is_some_and(|t| t <= now));
        let unsent = std::mem::take(&mut self.unsent);
        hand.set_gathered(false);
        if got == 0 && !look && !released && !unsent {
            // Nothing arrived, changed or fell due: nothing to hand over or to send (the
            // polling loop's usual round, kept short).
            return Worked::default();
        }
        // What arrived is handed over first. An application thread handed a notification or a
        // message goes back to its caller at once (it usually replies, and the reply carries
        // the held answers); timers and sending wait for the next round, which follows at
        // once. The network thread does the same with messages it took for a relaying handler:
        // it hands them over before it sends anything, and holds the answers for the reply
        // another thread may send within microseconds.
        let relay = !app && got > 0 && host.relays();
        let handed = host.dispatch(conns, (app || relay).then_some(now + ANSWER_HOLD_US));
        let relayed = relay && host.relayed();
        let shortcut = ((app && handed) || relayed)
            && (!self.shortcut || may_end_early_again(got, unsent || owed(conns), now, self.whole_at, self.due));
        self.shortcut = shortcut;
        if shortcut {
            self.stale = true;
            // What submissions gathered still waits to go (next round, or a flush).
            self.unsent |= unsent;
            hand.set_gathered(unsent);
            return Worked { got, sent: 0 };
        }
        self.whole_at = now;
        let (fired, due) = if look { host.timeouts(conns, now) } else { (false, None) };
        if fired {
            host.dispatch(conns, None);
        }
        let sent = host.transmit(conns, now);
        if look && !fired && sent == 0 {
            self.due = due;
            self.stale = false;
        } else if look || got > 0 || sent > 0 {
            self.stale = true;
        }
        Worked { got, sent }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks when a round may end early right after one that did: with a lone frame, within
    // a hold of the last whole round, nothing waiting and no deadline passed it may; with
    // several frames (a stream's), at or past a hold since the last whole round, with
    // something waiting (operations gathered, a frame owed at once), or with a deadline
    // reached it may not (the whole round runs, with the timers and the sending).
    #[test]
    fn rounds_end_early_in_a_row_only_for_lone_frames_within_a_hold_of_a_whole_one() {
        let whole = 1_000;
        assert!(may_end_early_again(1, false, whole + 1, whole, None));
        assert!(may_end_early_again(1, false, whole + ANSWER_HOLD_US - 1, whole, Some(whole + ANSWER_HOLD_US)));
        assert!(!may_end_early_again(2, false, whole + 1, whole, None));
        assert!(!may_end_early_again(1, false, whole + ANSWER_HOLD_US, whole, None));
        assert!(!may_end_early_again(1, true, whole + 1, whole, None));
        assert!(!may_end_early_again(1, false, whole + 10, whole, Some(whole + 10)));
        assert!(!may_end_early_again(1, false, whole + 10, whole, Some(whole + 5)));
    }
}
