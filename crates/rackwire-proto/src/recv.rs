//! Receive side: which sequence numbers arrived, and when to acknowledge.

use std::collections::{BTreeMap, BTreeSet};

use rackwire_wire::{ACK_DUP_RANGES_MAX, ACK_RANGES_MAX};

use crate::{Config, Time};

pub(crate) enum Arrival {
    New { beyond_gap: bool },
    Duplicate,
}

#[derive(Debug, Default)]
pub(crate) struct RecvState {
    /// Every sequence number below this arrived.
    pub next: u64,
    /// Arrived above `next`.
    above: BTreeSet<u64>,
    /// Data frames not yet acknowledged.
    unacked: u32,
    ack_deadline: Option<Time>,
    /// Send an explicit (selective) acknowledgement now.
    pub ack_now: bool,
    /// Last data frame's timestamp and link, echoed in acknowledgements.
    pub echo: (u32, u8),
    /// Missing sequence numbers and when each was last reported missing.
    nacked: BTreeMap<u64, Time>,
    /// Some gap should be reported.
    pub nack_due: bool,
    /// Frames that arrived again since the last explicit acknowledgement (at most
    /// [`DUPS_MAX`]), reported so the sender can undo a needless window cut.
    dups: BTreeSet<u64>,
    pub any: bool,
}

/// The most duplicate arrivals remembered between two acknowledgements.
const DUPS_MAX: usize = 64;

/// Runs of consecutive sequence numbers in `seqs` as ranges `[start, end)` on the wire, lowest
/// first, at most `max` of them.
fn ranges_of(seqs: &BTreeSet<u64>, max: usize) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &s in seqs {
        let full = out.len() == max;
        match out.last_mut() {
            Some(r) if r.1 == s as u32 => r.1 = (s + 1) as u32,
            _ if full => break,
            _ => out.push((s as u32, (s + 1) as u32)),
        }
    }
    out
}

/// Missing frames are reported again at most this often.
const NACK_REPEAT_US: Time = 2_000;

impl RecvState {
    /// Whether frame `seq` arrived already.
    pub fn is_duplicate(&self, seq: u64) -> bool {
        seq < self.next || self.above.contains(&seq)
    }

    /// Record an arriving data frame.
    pub fn on_data(&mut self, seq: u64, ts: u32, link: u8, now: Time, cfg: &Config) -> Arrival {
        if self.is_duplicate(seq) {
            if self.dups.len() < DUPS_MAX {
                self.dups.insert(seq);
            }
            self.ack_now = true;
            return Arrival::Duplicate;
        }
        self.any = true;
        self.echo = (ts, link);
        let beyond_gap = seq > self.next;
        if seq == self.next {
            self.next += 1;
            while self.above.remove(&self.next) {
                self.next += 1;
            }
            self.nacked = self.nacked.split_off(&self.next);
        } else {
            self.above.insert(seq);
            // The missing frames to report, the first WINDOW_FRAMES_MAX of the gap at most
            // (the rest are reported once those arrive).
            for s in self.next..seq.min(self.next + crate::WINDOW_FRAMES_MAX as u64) {
                if self.nacked.len() >= crate::WINDOW_FRAMES_MAX {
                    break;
                }
                if !self.above.contains(&s) && !self.nacked.contains_key(&s) {
                    self.nacked.insert(s, 0);
                }
            }
            self.nacked.remove(&seq);
            self.ack_now = true;
            self.nack_due = true;
        }
        self.unacked += 1;
        if self.unacked >= cfg.ack_every_frames {
            self.ack_now = true;
        } else if self.ack_deadline.is_none() {
            self.ack_deadline = Some(now + cfg.ack_delay_us);
        }
        Arrival::New { beyond_gap }
    }

    /// Whether an explicit acknowledgement is due.
    pub fn ack_due(&self, now: Time) -> bool {
        self.ack_now || self.ack_deadline.is_some_and(|d| now >= d)
    }

    pub fn ack_deadline(&self) -> Option<Time> {
        if self.ack_now {
            None
        } else {
            self.ack_deadline
        }
    }

    /// An acknowledgement went out (explicit, or piggybacked with `selective = false`).
    pub fn acked(&mut self, selective: bool) {
        self.unacked = 0;
        self.ack_deadline = None;
        if selective || (self.above.is_empty() && self.dups.is_empty()) {
            self.ack_now = false;
        }
    }

    /// Ranges above `next` that arrived, lowest first.
    pub fn sack_ranges(&self) -> Vec<(u32, u32)> {
        ranges_of(&self.above, ACK_RANGES_MAX)
    }

    /// Duplicate arrivals since the last explicit acknowledgement, as ranges (at most
    /// [`ACK_DUP_RANGES_MAX`], lowest first), forgotten once taken.
    pub fn take_dups(&mut self) -> Vec<(u32, u32)> {
        let out = ranges_of(&self.dups, ACK_DUP_RANGES_MAX);
        self.dups.clear();
        out
    }

    /// Missing ranges not reported in the last while; marks them reported.
    pub fn take_nacks(&mut self, now: Time) -> Vec<(u32, u32)> {
        self.nack_due = false;
        let mut out: Vec<(u32, u32)> = Vec::new();
        for (&s, last) in self.nacked.iter_mut() {
            if *last != 0 && now.saturating_sub(*last) < NACK_REPEAT_US {
                continue;
            }
            let extends = matches!(out.last(), Some((_, e)) if *e == s as u32);
            if extends {
                if let Some(r) = out.last_mut() {
                    r.1 = (s + 1) as u32;
                }
            } else if out.len() == ACK_RANGES_MAX {
                break;
            } else {
                out.push((s as u32, (s + 1) as u32));
            }
            *last = now.max(1);
        }
        out
    }
}
