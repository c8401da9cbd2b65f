//! The path's frame size: the longest frame every link carries from end to end, proven by
//! padded probes.
//!
//! The handshake agrees on the smaller of the two ends' largest frames (each end's links'
//! interfaces, or its `link_mtu`). A switch or router between them may carry less and drop a
//! longer frame without a word (no ICMP "too big" comes back, or the frame may not be cut up):
//! every full frame would then be lost, sent again and lost again. So once established, each
//! link sends probes padded to the agreed frame length and to each shorter length of
//! [`PATH_FRAME_RUNGS`] at once; the peer answers each with a reply padded to the same length,
//! which proves the path both ways. The agreed length answered ends the link's search at
//! once; otherwise the longest answered stands after [`PATH_PROBE_TRIES`] tries (a lost probe
//! is not taken for a path too narrow), each try waiting a few round trips.
//!
//! Data waits for the search (one round trip on a sound path): until every link has proven a
//! length or run out of tries, or, once one has, for at most the probe timeout. The
//! connection's data frames are then the shortest length the answering links proved, so no
//! frame is sent that the path would drop, and every link's first round-trip sample is taken
//! on idle links (the window's queueing rule goes by the quickest one). A link that proved
//! nothing by then (down, or slow to answer) carries no data, and is searched again every
//! probe interval (and when it comes back up); once it proves a length at least the
//! connection's, it carries data. Answers to a peer that is already sending are cut to
//! [`PATH_FRAME_SAFE`] bytes meanwhile, which any IP path carries.

use rackwire_wire::frame::HEADER_LEN;
use rackwire_wire::payload::PROBE_LEN;
use rackwire_wire::{FrameKind, ProbeRepr};

use super::{Connection, Event, FrameBufs, SplitTransmit};
use crate::seal::TRAILER_LEN;
use crate::Time;

/// Frame lengths tried beside the agreed one: what IP MTUs of 9000, 1500 and 1280 bytes
/// leave for a UDP payload over IPv6 (over IPv4, 20 bytes more).
pub const PATH_FRAME_RUNGS: [usize; 3] = [8952, 1452, 1232];
/// The longest data frame sent before the path's length is known: what the smallest MTU an
/// IPv6 path may have (1280) leaves for a UDP payload, so any path carries it.
pub const PATH_FRAME_SAFE: usize = 1232;
const _: () = assert!(PATH_FRAME_SAFE >= rackwire_wire::payload::FRAME_LEN_MIN, "a safe frame holds a segment");
/// Tries (each a probe of every length not yet answered) before the longest length answered
/// stands: a lost probe is not taken for a path that is too narrow.
pub const PATH_PROBE_TRIES: u32 = 3;
/// A rung is tried only this many bytes or more under the length before it (8952 after 8972
/// would fail for the same reason).
const PATH_RUNG_GAP_MIN: usize = 128;
/// A try lasts this many round trips of the link's quickest answer (once one came; the probe
/// timeout before), within [`PATH_TRY_MIN_US`] and the probe timeout.
const PATH_TRY_RTTS: u64 = 4;
/// The shortest try, µs: a peer busy for a moment is not taken for a narrow path.
const PATH_TRY_MIN_US: Time = 2_000;

/// One link's search.
#[derive(Clone, Debug, Default)]
struct LinkPath {
    /// Tries made.
    tries: u32,
    /// The probes of the current try: token and length, and when the try began.
    pending: Vec<(u32, usize)>,
    try_began: Time,
    /// A try is to be sent.
    due: bool,
    /// The longest length answered so far.
    best: Option<usize>,
    /// The quickest answer's round trip, µs (what a try's length goes by).
    rtt: Option<Time>,
    /// Searched to the end: the agreed length answered, or no tries left.
    done: bool,
}

impl LinkPath {
    fn searching() -> Self {
        LinkPath { due: true, ..Default::default() }
    }
}

/// The search over every link, and its outcome.
#[derive(Clone, Debug, Default)]
pub(super) struct PathSize {
    /// Lengths to try, longest first: the agreed frame length, then the rungs under it.
    lengths: Vec<usize>,
    links: Vec<LinkPath>,
    /// The frame length data goes in, once the search is over.
    settled: Option<usize>,
    /// When the search started.
    started: Time,
}

impl Connection {
    /// Start the search on every link (once established, at `now`) from the frame length the
    /// handshake agreed on. A length no longer than [`PATH_FRAME_SAFE`] needs no proof.
    pub(super) fn start_path_search(&mut self, now: Time) {
        let agreed = self.frame_max();
        let mut lengths = vec![agreed];
        for r in PATH_FRAME_RUNGS {
            if r + PATH_RUNG_GAP_MIN <= lengths[lengths.len() - 1] {
                lengths.push(r);
            }
        }
        let searching = agreed > PATH_FRAME_SAFE;
        let link = if searching { LinkPath::searching() } else { LinkPath { done: true, ..Default::default() } };
        self.path = PathSize {
            lengths,
            links: vec![link; self.links.len()],
            settled: (!searching).then_some(agreed),
            started: now,
        };
    }

    /// The frame length the handshake agreed on (both ends' links' announced lengths);
    /// [`Connection::frame_max`] is shorter where the path proved to carry less.
    pub fn agreed_frame_max(&self) -> usize {
        self.path.lengths.first().copied().unwrap_or_else(|| self.frame_max())
    }

    /// The frame length data goes in once the search is over (0 before), and the length each
    /// link proved (0 while it searches or where it proved none): the statistics' figures.
    pub(super) fn path_figures(&self) -> (u64, impl Iterator<Item = u64> + '_) {
        let links = self.path.links.iter().map(|l| if l.done { l.best.unwrap_or(0) as u64 } else { 0 });
        (self.path.settled.unwrap_or(0) as u64, links)
    }

    /// Whether data may go: the search is over.
    pub(super) fn path_settled(&self) -> bool {
        self.path.settled.is_some()
    }

    /// Segment bytes a frame of data (an answer, a datagram) carries now: the agreed payload
    /// once the path is settled, at most [`PATH_FRAME_SAFE`]'s before.
    pub(super) fn data_payload_max(&self) -> usize {
        match self.path.settled {
            Some(_) => self.payload_max,
            None => self.payload_max.min(PATH_FRAME_SAFE - HEADER_LEN - TRAILER_LEN),
        }
    }

    /// The payload that makes a frame `len` bytes long (a probe's, padding included).
    fn probe_payload_len(&self, len: usize) -> usize {
        let trailer = if self.sealed() { TRAILER_LEN } else { 0 };
        len.saturating_sub(HEADER_LEN + trailer).max(PROBE_LEN)
    }

    /// The longest reply payload this end sends to a padded probe: its agreed frame's.
    pub(super) fn probe_reply_len_max(&self) -> usize {
        self.probe_payload_len(self.agreed_frame_max())
    }

    /// How long a try on `link` lasts.
    fn path_try_us(&self, link: usize) -> Time {
        let timeout = self.cfg.probe_timeout_us;
        match self.path.links[link].rtt {
            Some(rtt) => rtt.saturating_mul(PATH_TRY_RTTS).clamp(PATH_TRY_MIN_US.min(timeout), timeout),
            None => timeout,
        }
    }

    /// The next padded probe of a try due on some link, sent: the longest length first.
    pub(super) fn poll_path_probe(&mut self, now: Time, bufs: &mut dyn FrameBufs) -> Option<SplitTransmit> {
        let link = self.path.links.iter().position(|l| l.due && !l.done)?;
        let l = &self.path.links[link];
        // The lengths still to prove, longer than the longest answered.
        let next = self
            .path
            .lengths
            .iter()
            .copied()
            .find(|&len| l.best.is_none_or(|b| len > b) && !l.pending.iter().any(|&(_, p)| p == len));
        let Some(len) = next else {
            self.path.links[link].due = false;
            return None;
        };
        self.probe_token = self.probe_token.wrapping_add(1);
        let token = self.probe_token;
        let l = &mut self.path.links[link];
        if l.pending.is_empty() {
            l.try_began = now;
        }
        l.pending.push((token, len));
        self.links[link].stats.probes += 1;
        let p = ProbeRepr { reply: false, token, echo_ts: 0 };
        let payload = self.probe_payload_len(len);
        self.emit(now, bufs, link, FrameKind::Probe, 0, payload, |b| p.emit(b))
    }

    /// A probe reply of `payload` bytes on `link` at `now`: true if it answered one of this
    /// link's padded probes (and was as long: a shorter reply proves nothing of the way back).
    /// The agreed length's round trip is the link's first sample, taken before data has queued
    /// anywhere: the quickest round trip the window's queueing rule goes by starts true.
    pub(super) fn on_path_reply(&mut self, now: Time, link: usize, token: u32, payload: usize) -> bool {
        let Some(l) = self.path.links.get(link) else { return false };
        let Some(i) = l.pending.iter().position(|&(t, _)| t == token) else { return false };
        let (_, len) = l.pending[i];
        if payload < self.probe_payload_len(len) {
            // Counted as unanswered when the try ends.
            return true;
        }
        let agreed = self.path.lengths[0];
        let began = l.try_began;
        let l = &mut self.path.links[link];
        l.pending.remove(i);
        l.best = l.best.max(Some(len));
        let rtt = now.saturating_sub(began);
        l.rtt = Some(l.rtt.map_or(rtt, |r| r.min(rtt)));
        if len == agreed {
            l.done = true;
            l.pending.clear();
            self.links[link].rtt_sample(rtt);
            self.link_proven(link, len);
        }
        true
    }

    /// `link` proved `len`: the search settles once every link has, or the link carries data
    /// again if it proves enough after the search settled.
    fn link_proven(&mut self, link: usize, len: usize) {
        match self.path.settled {
            None => self.settle_path(false),
            Some(settled) => self.links[link].fits = len >= settled,
        }
    }

    /// When the search gives up waiting for links that proved nothing: the probe timeout after
    /// it started, if some link proved a length by then and every link still searching is
    /// silent. A link that answered a shorter length is narrow, not silent: it is waited for
    /// (its tries are bounded), or the search would settle on a longer length without it and
    /// keep a rail out of the data for good.
    fn path_grace_end(&self) -> Option<Time> {
        let links = &self.path.links;
        let waiting = self.path.settled.is_none()
            && links.iter().any(|l| l.done && l.best.is_some())
            && links.iter().all(|l| l.done || l.best.is_none());
        waiting.then_some(self.path.started + self.cfg.probe_timeout_us)
    }

    /// When the first try ends, the search's grace, or a link that proved nothing is searched
    /// again (a probe interval after its last try began).
    pub(super) fn path_deadline(&self) -> Option<Time> {
        let tries = (0..self.path.links.len()).filter_map(|i| {
            let l = &self.path.links[i];
            if !l.done && !l.pending.is_empty() {
                Some(l.try_began + self.path_try_us(i))
            } else {
                (l.done && l.best.is_none() && self.path.settled.is_some())
                    .then(|| l.try_began + self.cfg.probe_interval_us)
            }
        });
        tries.chain(self.path_grace_end()).min()
    }

    /// Tries that ran out: another (the lengths not answered yet), or after
    /// [`PATH_PROBE_TRIES`] the longest answered stands (none: the link proved nothing). Past
    /// the grace ([`Connection::path_grace_end`]) the search settles without the links still
    /// searching.
    pub(super) fn path_timeouts(&mut self, now: Time) {
        let settled = self.path.settled.is_some();
        for i in 0..self.path.links.len() {
            let try_us = self.path_try_us(i);
            let l = &mut self.path.links[i];
            if settled && l.done && l.best.is_none() && now >= l.try_began + self.cfg.probe_interval_us {
                // Silent through its search (down, or not yet known to be): searched again.
                *l = LinkPath::searching();
                continue;
            }
            if l.done || l.pending.is_empty() || now < l.try_began + try_us {
                continue;
            }
            l.pending.clear();
            l.tries += 1;
            if l.tries < PATH_PROBE_TRIES {
                l.due = true;
                continue;
            }
            l.done = true;
            match l.best {
                Some(len) => self.link_proven(i, len),
                None if self.path.settled.is_none() => self.settle_path(false),
                None => {}
            }
        }
        if self.path_grace_end().is_some_and(|end| now >= end) {
            self.settle_path(true);
        }
    }

    /// A link answers again: if it has proven nothing, it is searched again.
    pub(super) fn path_link_up(&mut self, link: usize) {
        if let Some(l) = self.path.links.get_mut(link) {
            if l.done && l.best.is_none() {
                *l = LinkPath::searching();
            }
        }
    }

    /// Once every link is searched (or, `anyway`, at the grace's end): data frames take the
    /// shortest length a link proved (none proved: [`PATH_FRAME_SAFE`]'s). Shorter than agreed,
    /// the windows grow to keep as many bytes in flight, and the driver hears of it
    /// ([`Event::PathCut`]). Links that proved nothing keep out of data until they prove enough.
    fn settle_path(&mut self, anyway: bool) {
        if !anyway && self.path.links.iter().any(|l| !l.done) {
            return;
        }
        let agreed = self.frame_max();
        let proven = |l: &LinkPath| if l.done { l.best } else { None };
        let shortest = self.path.links.iter().filter_map(proven).min();
        let len = shortest.unwrap_or(PATH_FRAME_SAFE.min(agreed));
        self.path.settled = Some(len);
        if shortest.is_some() {
            for (link, p) in self.links.iter_mut().zip(&self.path.links) {
                link.fits = proven(p).is_some();
            }
        }
        if len < agreed {
            let payload = len - HEADER_LEN - TRAILER_LEN;
            self.shrink_frames(payload);
            self.events.push_back(Event::PathCut { frame_len: len, agreed });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the safe length against the rungs: it is the shortest of them (so anything sent
    // before the search ends fits whatever length it settles on), and the rungs go down.
    #[test]
    fn the_safe_length_is_the_shortest_rung() {
        assert_eq!(PATH_FRAME_RUNGS.iter().min(), Some(&PATH_FRAME_SAFE));
        assert!(PATH_FRAME_RUNGS.windows(2).all(|w| w[0] > w[1]));
    }
}
