//! The sender's frames in flight, by sequence number.
//!
//! Sequence numbers are handed out in order and retired in almost the same order, so the frames
//! sent and not yet acknowledged sit in a ring indexed by `seq - base`: finding, adding and
//! retiring one is a step of arithmetic, and nothing is moved around as frames come and go
//! (an ordered tree moved whole frame records on every insert and removal). A slot holds a
//! pointer, so a long run of retired slots behind one frame still waiting costs little; the
//! run is bounded all the same ([`SEND_SPAN_MAX`]).

use std::collections::VecDeque;

/// Most sequence numbers from the oldest frame in flight to the newest: a frame that is never
/// acknowledged holds back new ones once this many went out after it (as a window would).
pub const SEND_SPAN_MAX: u64 = 1 << 16;

/// Frames in flight keyed by sequence number (see the module documentation).
#[derive(Debug)]
pub(crate) struct SentRing<T> {
    /// Sequence number of `slots[0]`.
    base: u64,
    /// `None` for a retired frame; the first slot is never `None`.
    slots: VecDeque<Option<Box<T>>>,
    /// Slots holding a frame.
    len: usize,
}

impl<T> Default for SentRing<T> {
    fn default() -> Self {
        SentRing { base: 0, slots: VecDeque::new(), len: 0 }
    }
}

impl<T> SentRing<T> {
    /// Frames in flight.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The oldest frame's sequence number.
    pub fn first_seq(&self) -> Option<u64> {
        (self.len > 0).then_some(self.base)
    }

    /// Whether one more frame fits within [`SEND_SPAN_MAX`] of the oldest.
    pub fn has_room(&self) -> bool {
        (self.slots.len() as u64) < SEND_SPAN_MAX
    }

    /// Add frame `seq`, newer than every frame added so far (sequence numbers only grow).
    /// Returns false, adding nothing, for an older or taken number.
    pub fn push(&mut self, seq: u64, v: T) -> bool {
        if self.len == 0 {
            self.slots.clear();
            self.base = seq;
        }
        let end = self.base + self.slots.len() as u64;
        if seq < end {
            return false;
        }
        for _ in end..seq {
            self.slots.push_back(None);
        }
        self.slots.push_back(Some(Box::new(v)));
        self.len += 1;
        true
    }

    fn index(&self, seq: u64) -> Option<usize> {
        let i = seq.checked_sub(self.base)?;
        (i < self.slots.len() as u64).then_some(i as usize)
    }

    pub fn get(&self, seq: u64) -> Option<&T> {
        self.slots.get(self.index(seq)?)?.as_deref()
    }

    pub fn get_mut(&mut self, seq: u64) -> Option<&mut T> {
        let i = self.index(seq)?;
        self.slots.get_mut(i)?.as_deref_mut()
    }

    /// Retire frame `seq`.
    pub fn remove(&mut self, seq: u64) -> Option<T> {
        let i = self.index(seq)?;
        let v = self.slots.get_mut(i)?.take()?;
        self.len -= 1;
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(*v)
    }

    /// Frames with `start <= seq < end`, oldest first.
    pub fn range(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &T)> + '_ {
        let from = start.saturating_sub(self.base).min(self.slots.len() as u64) as usize;
        let to = end.saturating_sub(self.base).min(self.slots.len() as u64) as usize;
        let base = self.base;
        self.slots
            .range(from..to.max(from))
            .enumerate()
            .filter_map(move |(k, s)| s.as_deref().map(|v| (base + (from + k) as u64, v)))
    }

    /// Every frame in flight, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> + '_ {
        self.range(self.base, u64::MAX)
    }

    pub fn clear(&mut self) {
        self.slots.clear();
        self.len = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Step {
        /// Add the next frame, this many numbers after the newest (0: the very next).
        Push(u8),
        Remove(u16),
        Range(u16, u16),
        Bump(u16),
        Clear,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u8..3).prop_map(Step::Push),
            4 => (0u16..300).prop_map(Step::Remove),
            2 => (0u16..300, 0u16..300).prop_map(|(a, b)| Step::Range(a, b)),
            1 => (0u16..300).prop_map(Step::Bump),
            1 => Just(Step::Clear),
        ]
    }

    proptest! {
        // Checks the ring against an ordered map doing the same steps (adds with gaps, removals
        // in any order, ranges, changes in place, clearing): the same frames, the same order,
        // the same answers, and the oldest frame always at the front.
        #[test]
        fn behaves_like_an_ordered_map(steps in proptest::collection::vec(step(), 1..400)) {
            let mut ring: SentRing<u64> = SentRing::default();
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            let mut next = 1000u64;
            for s in steps {
                match s {
                    Step::Push(gap) => {
                        next += gap as u64;
                        prop_assert!(ring.push(next, next * 7));
                        model.insert(next, next * 7);
                        next += 1;
                    }
                    Step::Remove(k) => {
                        let seq = 1000 + k as u64;
                        prop_assert_eq!(ring.remove(seq), model.remove(&seq));
                    }
                    Step::Range(a, b) => {
                        let (a, b) = (1000 + a as u64, 1000 + b as u64);
                        let got: Vec<(u64, u64)> = ring.range(a, b).map(|(k, v)| (k, *v)).collect();
                        let want: Vec<(u64, u64)> =
                            if a < b { model.range(a..b).map(|(k, v)| (*k, *v)).collect() } else { vec![] };
                        prop_assert_eq!(got, want);
                    }
                    Step::Bump(k) => {
                        let seq = 1000 + k as u64;
                        if let Some(v) = ring.get_mut(seq) {
                            *v += 1;
                        }
                        if let Some(v) = model.get_mut(&seq) {
                            *v += 1;
                        }
                    }
                    Step::Clear => {
                        ring.clear();
                        model.clear();
                    }
                }
                prop_assert_eq!(ring.len(), model.len());
                prop_assert_eq!(ring.first_seq(), model.keys().next().copied());
                let all: Vec<(u64, u64)> = ring.iter().map(|(k, v)| (k, *v)).collect();
                let want: Vec<(u64, u64)> = model.iter().map(|(k, v)| (*k, *v)).collect();
                prop_assert_eq!(all, want);
                for k in model.keys() {
                    prop_assert_eq!(ring.get(*k), model.get(k));
                }
            }
        }
    }

    // Checks the ring's limits: an older or repeated number is refused, and a frame that is
    // never retired leaves no room once SEND_SPAN_MAX numbers went out after it.
    #[test]
    fn refuses_old_numbers_and_bounds_its_span() {
        let mut ring: SentRing<u8> = SentRing::default();
        assert!(ring.push(10, 1));
        assert!(!ring.push(10, 2), "a taken number");
        assert!(!ring.push(9, 2), "an older number");
        let mut seq = 11;
        while ring.has_room() {
            assert!(ring.push(seq, 0));
            ring.remove(seq);
            seq += 1;
        }
        assert_eq!(seq - 10, SEND_SPAN_MAX, "the oldest frame holds the span open");
        assert_eq!(ring.len(), 1);
        assert_eq!(ring.remove(10), Some(1));
        assert!(ring.has_room() && ring.is_empty());
    }
}
