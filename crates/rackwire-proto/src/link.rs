//! Per-link state: round-trip estimate, window, liveness.

use std::collections::VecDeque;

use crate::stats::LinkStats;
use crate::{Config, Time};

/// Smoothed round-trip figures closer than this (µs) to where they are heading are set to it.
const SMOOTHING_FLOOR_US: f64 = 1e-6;

/// How much a link's window shrinks on loss (once per round trip).
const LOSS_BETA: f64 = 0.7;
/// How much a link's window shrinks when its round trips show a queue past the allowance
/// (once per round trip).
const QUEUE_BETA: f64 = 0.8;
/// Round-trip samples in a row past the allowance that make the window shrink.
const QUEUED_SAMPLES_TO_CUT: u32 = 2;
/// Queueing delay a link may build before its window stops growing, beyond its minimum round
/// trip (µs), as a floor; the allowance is otherwise one minimum round trip.
const QUEUE_DELAY_FLOOR_US: f64 = 100.0;

/// The window before a cut, kept until the cut's losses all prove spurious (or the next cut).
#[derive(Debug, Clone, Copy)]
struct Undo {
    cwnd: f64,
    ssthresh: f64,
    /// Frames declared lost in this cut's episode whose retransmission is not yet known to
    /// have been unneeded.
    pending: u32,
}

#[derive(Debug)]
pub(crate) struct Link {
    pub up: bool,
    /// Carries the connection's data frames (false: the path proved too narrow for them).
    pub fits: bool,
    /// Timed out recently: no new data until it shows signs of life.
    pub suspect: bool,
    srtt: Option<f64>,
    rttvar: f64,
    min_rtt: f64,
    latest_rtt: f64,
    backoff: u32,
    pub cwnd: f64,
    ssthresh: f64,
    pub inflight: usize,
    last_cut: Time,
    /// The latest send time of a frame sent on it and delivered (first transmissions only).
    pub rack_time: Time,
    /// Counts cuts: a loss belongs to the episode of the latest cut.
    pub episode: u32,
    undo: Option<Undo>,
    /// Round-trip samples in a row that showed a queue past the allowance (one alone may be a
    /// scheduling hiccup).
    queued_samples: u32,
    pub last_heard: Time,
    pub probe: Option<(u32, Time)>,
    pub probe_due: bool,
    pub missed: u32,
    pub stats: LinkStats,
    /// The frames sent on it, as (sequence number, when), in the order sent: the first still
    /// counted against this link is the one whose deadlines come first. Entries of frames
    /// since acknowledged, declared lost or sent again elsewhere are dropped once they reach
    /// the front (so it holds at most the frames sent since its oldest one still in flight).
    pub sent_order: VecDeque<(u64, Time)>,
}

impl Link {
    pub fn new(cfg: &Config, now: Time) -> Self {
        Link {
            up: true,
            fits: true,
            suspect: false,
            srtt: None,
            rttvar: 0.0,
            min_rtt: f64::MAX,
            latest_rtt: 0.0,
            backoff: 0,
            cwnd: cfg.link_window_initial as f64,
            ssthresh: cfg.link_window_max as f64,
            inflight: 0,
            last_cut: 0,
            rack_time: 0,
            episode: 0,
            undo: None,
            queued_samples: 0,
            last_heard: now,
            probe: None,
            probe_due: false,
            missed: 0,
            stats: LinkStats::default(),
            sent_order: VecDeque::new(),
        }
    }

    /// A round-trip sample (RFC 6298 smoothing).
    pub fn rtt_sample(&mut self, rtt: Time) {
        let r = rtt.max(1) as f64;
        self.latest_rtt = r;
        self.min_rtt = self.min_rtt.min(r);
        self.queued_samples = if self.queueing() { self.queued_samples.saturating_add(1) } else { 0 };
        match self.srtt {
            None => {
                self.srtt = Some(r);
                self.rttvar = r / 2.0;
            }
            Some(s) => {
                // Steady samples make both decay geometrically; below a millionth of a
                // microsecond they are snapped, or they sink into subnormal numbers, on which
                // every later sample costs the processor a slow path.
                let var = 0.75 * self.rttvar + 0.25 * (s - r).abs();
                self.rttvar = if var < SMOOTHING_FLOOR_US { 0.0 } else { var };
                let srtt = 0.875 * s + 0.125 * r;
                self.srtt = Some(if (srtt - r).abs() < SMOOTHING_FLOOR_US { r } else { srtt });
            }
        }
        self.backoff = 0;
        self.stats.srtt_us = self.srtt.unwrap_or(0.0) as u64;
        self.stats.min_rtt_us = self.min_rtt as u64;
    }

    /// The quickest round trip measured, if any.
    pub fn min_rtt(&self) -> Option<Time> {
        self.srtt.map(|_| self.min_rtt as Time)
    }

    pub fn srtt(&self, cfg: &Config) -> Time {
        self.srtt.map_or(cfg.rto_initial_us, |s| s as Time)
    }

    pub fn rttvar(&self) -> Time {
        self.rttvar as Time
    }

    /// Retransmission timeout: srtt + 4 rttvar, bounded, doubled per back-off.
    pub fn rto(&self, cfg: &Config) -> Time {
        let base = match self.srtt {
            None => cfg.rto_initial_us,
            Some(s) => (s + 4.0 * self.rttvar) as Time,
        };
        let backed = base.saturating_mul(1 << self.backoff.min(16));
        backed.clamp(cfg.rto_min_us, cfg.rto_max_us)
    }

    pub fn window(&self) -> usize {
        self.cwnd as usize
    }

    /// A suspect link (it timed out) gets one frame at a time until it answers.
    pub fn has_room(&self) -> bool {
        self.up && self.fits && self.inflight < if self.suspect { 1 } else { self.window() }
    }

    /// The queueing delay allowed before the window stops growing, µs.
    fn allowance(&self) -> f64 {
        self.min_rtt.max(QUEUE_DELAY_FLOOR_US)
    }

    /// Whether the latest round trip shows a queue building beyond the allowance.
    fn queueing(&self) -> bool {
        self.latest_rtt > self.min_rtt + self.allowance()
    }

    /// Start over with the configured windows (they changed before any data moved).
    pub fn reset_window(&mut self, cfg: &Config) {
        self.cwnd = cfg.link_window_initial as f64;
        self.ssthresh = cfg.link_window_max as f64;
        self.stats.window = self.cwnd as u64;
    }

    /// Frames got `step` times shorter mid-connection: the window, in frames, grows as much
    /// (within the configured bounds), so as many bytes stay in flight.
    pub fn scale_window(&mut self, step: f64, cfg: &Config) {
        let (min, max) = (cfg.link_window_min as f64, cfg.link_window_max as f64);
        self.cwnd = (self.cwnd * step).clamp(min, max);
        self.ssthresh = (self.ssthresh * step).clamp(min, max);
        self.stats.window = self.cwnd as u64;
    }

    /// A frame sent on this link was acknowledged: grow the window, unless the round trip shows
    /// a queue building (then the link is full: more window would only add delay and, at a
    /// full buffer, burst losses).
    pub fn on_ack(&mut self, cfg: &Config, now: Time) {
        self.suspect = false;
        // A queue past the allowance in more than one sample in a row shrinks the window (once
        // a round trip), rather than only stopping its growth: windows that share a queue then
        // converge, where held still each would keep the share it had when the queue formed
        // (two opposite transfers, whose acknowledgements wait behind each other's data, see
        // the same queue; the one whose window was cut would never regrow).
        if self.queued_samples >= QUEUED_SAMPLES_TO_CUT && now.saturating_sub(self.last_cut) >= self.srtt(cfg) {
            self.last_cut = now;
            self.ssthresh = (self.cwnd * QUEUE_BETA).max(cfg.link_window_min as f64);
            self.cwnd = self.ssthresh;
            self.stats.window = self.cwnd as u64;
            return;
        }
        if self.queueing() {
            return;
        }
        if self.cwnd < self.ssthresh {
            self.cwnd += 1.0;
        } else {
            self.cwnd += 1.0 / self.cwnd;
        }
        self.cwnd = self.cwnd.min(cfg.link_window_max as f64);
        self.stats.window = self.cwnd as u64;
    }

    /// A frame sent on this link was lost: shrink the window, at most once per round trip.
    /// The loss joins the latest cut's episode ([`Link::episode`]).
    pub fn on_loss(&mut self, cfg: &Config, now: Time) {
        self.stats.losses += 1;
        if now.saturating_sub(self.last_cut) < self.srtt(cfg) {
            if let Some(u) = &mut self.undo {
                u.pending += 1;
            }
            return;
        }
        self.last_cut = now;
        self.stats.cuts += 1;
        self.episode = self.episode.wrapping_add(1);
        self.undo = Some(Undo { cwnd: self.cwnd, ssthresh: self.ssthresh, pending: 1 });
        self.ssthresh = (self.cwnd * LOSS_BETA).max(cfg.link_window_min as f64);
        self.cwnd = self.ssthresh;
        self.stats.window = self.cwnd as u64;
    }

    /// A frame declared lost in cut `episode` arrived after all: once every loss of the latest
    /// cut's episode proved so, the window before the cut is back, unless the link is queueing
    /// (then the cut stands, as a brake on the delay).
    pub fn on_spurious(&mut self, episode: u32) {
        if episode != self.episode {
            return;
        }
        let Some(u) = &mut self.undo else { return };
        u.pending -= 1;
        if u.pending > 0 {
            return;
        }
        let Some(u) = self.undo.take() else { return };
        if self.queueing() {
            return;
        }
        self.cwnd = self.cwnd.max(u.cwnd);
        self.ssthresh = self.ssthresh.max(u.ssthresh);
        self.stats.undone_cuts += 1;
        self.stats.window = self.cwnd as u64;
    }

    /// A frame of `len` bytes arrived on this link at `now`.
    pub fn heard(&mut self, now: Time, len: u64) {
        self.stats.frames_received += 1;
        self.stats.bytes_received += len;
        self.last_heard = now;
    }

    /// A frame of `len` bytes left on this link.
    pub fn sent(&mut self, len: u64) {
        self.stats.frames_sent += 1;
        self.stats.bytes_sent += len;
    }

    /// Data frame `seq`, sent at `now` (again, if `retransmit`), now counts against this
    /// link's window.
    pub fn count(&mut self, seq: u64, now: Time, retransmit: bool) {
        self.sent_order.push_back((seq, now));
        self.inflight += 1;
        if retransmit {
            self.stats.retransmits += 1;
        }
    }

    /// A frame that counted against this link's window no longer does (delivered, or lost).
    pub fn uncount(&mut self) {
        debug_assert!(self.inflight > 0, "a link's count of frames in flight went below zero");
        self.inflight -= 1;
    }

    /// The connection ended: nothing counts against this link any more.
    pub fn forget_in_flight(&mut self) {
        self.inflight = 0;
        self.sent_order.clear();
    }

    /// A frame first sent on this link at `sent_at` was delivered.
    pub fn delivered(&mut self, sent_at: Time) {
        self.rack_time = self.rack_time.max(sent_at);
    }

    /// A probe with `token` leaves now.
    pub fn start_probe(&mut self, token: u32, now: Time) {
        self.probe_due = false;
        self.probe = Some((token, now));
        self.stats.probes += 1;
    }

    /// The probe out went unanswered: another is due. True when this makes the link go down
    /// (`max` misses in a row).
    pub fn probe_missed(&mut self, max: u32) -> bool {
        self.probe = None;
        self.missed += 1;
        self.probe_due = true;
        if self.up && self.missed >= max {
            self.up = false;
            self.stats.downs += 1;
            return true;
        }
        false
    }

    /// A probe reply with `token` arrived at `now`. True when it brings the link back up.
    pub fn probe_answered(&mut self, token: u32, now: Time) -> bool {
        let Some((t, sent)) = self.probe else { return false };
        if t != token {
            return false;
        }
        self.probe = None;
        self.missed = 0;
        self.suspect = false;
        self.rtt_sample(now.saturating_sub(sent));
        !std::mem::replace(&mut self.up, true)
    }

    /// The retransmission timer fired for a frame sent here.
    pub fn on_timeout(&mut self, cfg: &Config, now: Time) {
        self.stats.timeouts += 1;
        self.on_loss(cfg, now);
        self.backoff = (self.backoff + 1).min(16);
        self.suspect = true;
        if self.probe.is_none() {
            self.probe_due = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that steady round trips leave the smoothed figures at exactly the sample and zero
    // variation, never in subnormal numbers (each later sample would then take the processor's
    // slow path): 10,000 equal samples, then one different one still moves them.
    #[test]
    fn steady_samples_settle_without_subnormals() {
        let cfg = Config::new(1, 1500);
        let mut l = Link::new(&cfg, 0);
        for _ in 0..10_000 {
            l.rtt_sample(7);
            let srtt = l.srtt.expect("sampled");
            assert!(srtt.is_normal() && (l.rttvar == 0.0 || l.rttvar.is_normal()), "{srtt} {}", l.rttvar);
        }
        assert_eq!(l.srtt, Some(7.0));
        assert_eq!(l.rttvar, 0.0);
        l.rtt_sample(15);
        assert_eq!(l.srtt, Some(8.0));
        assert_eq!(l.rttvar, 2.0);
    }
}
