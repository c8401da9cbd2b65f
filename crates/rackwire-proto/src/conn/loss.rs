//! Loss detection and recovery: acknowledgements retire frames and feed the links' round-trip
//! estimates; a frame overtaken by later deliveries, or past its retransmission timer, is
//! declared lost and queued to go again; losses later proved spurious undo their window cut.

use super::{Connection, Sent, State};
use crate::Time;

/// The most frames declared lost that a connection remembers, waiting for a report that they
/// arrived after all.
pub(super) const RETX_WATCH_MAX: usize = 1024;

impl Connection {
    pub(super) fn on_cumulative_ack(&mut self, now: Time, ack: u64) {
        let Some(first) = self.inflight.first_seq() else { return };
        if ack > first {
            self.on_delivered_range(now, first, ack);
        }
    }

    pub(super) fn on_delivered_range(&mut self, now: Time, start: u64, end: u64) {
        if end <= start || end > self.next_seq {
            return;
        }
        for seq in start.max(self.inflight.first_seq().unwrap_or(end))..end {
            let Some(s) = self.inflight.remove(seq) else { continue };
            if let Some(l) = s.counted_on {
                let link = &mut self.links[l];
                link.uncount();
                link.on_ack(&self.cfg, now);
            } else if !s.retransmitted {
                // Declared lost, yet the original arrived before any copy was sent.
                self.proved_spurious(seq);
            }
            if !s.retransmitted {
                let l = &mut self.links[s.link];
                l.rtt_sample(now.saturating_sub(s.sent_at));
                l.delivered(s.sent_at);
                self.rack_time = self.rack_time.max(s.sent_at);
            }
        }
        self.trim_sent_order();
    }

    /// The peer got these frames twice: those declared lost were not, so their links may undo
    /// the window cut they caused.
    pub(super) fn on_arrived_twice(&mut self, start: u64, end: u64) {
        let seqs: Vec<u64> = self.retx_watch.range(start..end).map(|(&s, _)| s).collect();
        for seq in seqs {
            self.proved_spurious(seq);
        }
    }

    /// Frame `seq`, declared lost, was not: its link learns (see [`Link::on_spurious`]).
    pub(super) fn proved_spurious(&mut self, seq: u64) {
        if let Some((link, episode)) = self.retx_watch.remove(&seq) {
            self.links[link].on_spurious(episode);
        }
    }

    /// The peer says these are missing: resend those that had time to arrive.
    pub(super) fn on_reported_missing(&mut self, now: Time, start: u64, end: u64) {
        let seqs: Vec<u64> = self.inflight.range(start, end).map(|(s, _)| s).collect();
        for seq in seqs {
            let Some(s) = self.inflight.get(seq) else { continue };
            if s.counted_on.is_some() && self.overtaken(s) && now >= self.loss_deadline(s) {
                self.lose(now, seq, false);
            }
        }
    }

    /// The frames counted against link `l`, in the order sent (so by deadline).
    pub(super) fn counted_on_link(&self, l: usize) -> impl Iterator<Item = (u64, &Sent)> + '_ {
        self.links[l].sent_order.iter().filter_map(move |&(seq, at)| {
            self.inflight.get(seq).filter(|s| s.counted_on == Some(l) && s.sent_at == at).map(|s| (seq, s))
        })
    }

    /// Drop the entries of the links' send order that no longer stand for a frame counted
    /// against that link, up to the first that does.
    pub(super) fn trim_sent_order(&mut self) {
        for l in 0..self.links.len() {
            while let Some(&(seq, at)) = self.links[l].sent_order.front() {
                if self.inflight.get(seq).is_some_and(|s| s.counted_on == Some(l) && s.sent_at == at) {
                    break;
                }
                self.links[l].sent_order.pop_front();
            }
        }
    }

    /// When frame `s` counts as lost: its retransmission timer, or sooner by the overtaking
    /// rule once a later frame was delivered.
    pub(super) fn loss_due(&self, s: &Sent) -> Time {
        let rto = self.rto_deadline(s);
        if self.overtaken(s) {
            self.loss_deadline(s).min(rto)
        } else {
            rto
        }
    }

    /// When a frame's retransmission timer fires: its link's timeout after it was sent.
    pub(super) fn rto_deadline(&self, s: &Sent) -> Time {
        s.sent_at + self.links[s.link].rto(&self.cfg)
    }

    /// Whether a frame sent after `s` was delivered (see [`Connection::loss_deadline`]).
    pub(super) fn overtaken(&self, s: &Sent) -> bool {
        s.sent_at < self.rack_time
    }

    /// When a frame overtaken by later ones counts as lost: its link's round trip plus slack,
    /// if a later frame on the same link was delivered (links keep order); one more round trip
    /// if only frames on other links overtook it (their queues differ, and a queue growing on
    /// its own link delays it past its smoothed round trip without losing it).
    pub(super) fn loss_deadline(&self, s: &Sent) -> Time {
        let l = &self.links[s.link];
        let at = s.sent_at + l.srtt(&self.cfg) + self.cfg.reorder_slack_us.max(4 * l.rttvar());
        if s.sent_at < l.rack_time {
            at
        } else {
            at + l.srtt(&self.cfg)
        }
    }

    pub(super) fn lose(&mut self, now: Time, seq: u64, timeout: bool) {
        let Some(s) = self.inflight.get_mut(seq) else { return };
        if let Some(l) = s.counted_on.take() {
            self.links[l].uncount();
            if timeout {
                self.links[l].on_timeout(&self.cfg, now);
            } else {
                self.links[l].on_loss(&self.cfg, now);
            }
            self.retx.push_back(seq);
            self.retx_watch.insert(seq, (l, self.links[l].episode));
            while self.retx_watch.len() > RETX_WATCH_MAX {
                self.retx_watch.pop_first();
            }
        }
    }

    pub(super) fn detect_losses(&mut self, now: Time) {
        self.losses_due = false;
        if self.state != State::Established {
            return;
        }
        // Per link, oldest first, up to the first frame not yet due: the later ones are not
        // either (their deadlines grow with the send time).
        let mut lost = Vec::new();
        for l in 0..self.links.len() {
            for (seq, s) in self.counted_on_link(l) {
                if now < self.loss_due(s) {
                    break;
                }
                lost.push((seq, !(self.overtaken(s) && now >= self.loss_deadline(s))));
            }
        }
        // In sequence order, as they were first sent.
        lost.sort_unstable_by_key(|&(seq, _)| seq);
        for (seq, timeout) in lost {
            self.lose(now, seq, timeout);
        }
        self.trim_sent_order();
    }
}
