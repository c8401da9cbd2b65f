//! Who is down since when, and when each may be forgotten (the forgetting itself, which
//! changes the state: the `forgetting` module). Nodes that left for good: a node down longer than the forget-after time (a transient node,
//! one with no name of its own whose key pair died with it, after a minute; and, when the
//! node table is full, the one down longest, after a shorter grace) is forgotten — its record,
//! its name (free for another key from then on), its published regions and every grant to or
//! from it — so the limits on nodes, regions and grants cannot fill up for good. Its id is
//! never handed out again (ids only grow), so grants an owner still holds for it reach no one.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::{NodeId, EVICT_AFTER_MIN, FORGET_AFTER_DEFAULT, TRANSIENT_FORGET_AFTER_DEFAULT};

/// How often nodes are looked at.
const CHECK_EVERY: Duration = Duration::from_millis(500);

/// Since when each known node has been down (nodes known at start count from then).
#[derive(Debug)]
pub(crate) struct Departed {
    since: HashMap<NodeId, Instant>,
    /// The known nodes that are transient.
    transient: HashSet<NodeId>,
    pub(crate) forget_after: Duration,
    pub(crate) forget_transient_after: Duration,
    checked: Instant,
}

impl Departed {
    /// `known`: each known node, and whether it is transient.
    pub(crate) fn new(known: impl Iterator<Item = (NodeId, bool)>) -> Departed {
        let now = Instant::now();
        let (mut since, mut transient) = (HashMap::new(), HashSet::new());
        for (id, t) in known {
            since.insert(id, now);
            if t {
                transient.insert(id);
            }
        }
        Departed {
            since,
            transient,
            forget_after: FORGET_AFTER_DEFAULT,
            forget_transient_after: TRANSIENT_FORGET_AFTER_DEFAULT,
            checked: now,
        }
    }

    /// Count `known` as down from now, and nothing else (a host that now leads).
    pub(crate) fn restart(&mut self, known: impl Iterator<Item = (NodeId, bool)>) {
        *self = Departed {
            forget_after: self.forget_after,
            forget_transient_after: self.forget_transient_after,
            ..Departed::new(known)
        };
    }

    pub(crate) fn up(&mut self, id: NodeId, transient: bool) {
        self.since.remove(&id);
        if transient {
            self.transient.insert(id);
        }
    }

    /// How long `id` may stay down.
    fn grace(&self, id: NodeId) -> Duration {
        if self.transient.contains(&id) {
            self.forget_transient_after.min(self.forget_after)
        } else {
            self.forget_after
        }
    }

    pub(crate) fn down(&mut self, id: NodeId) {
        self.since.insert(id, Instant::now());
    }

    /// The nodes down past their time, if it is time to look again (every [`CHECK_EVERY`],
    /// or sooner when a forget-after time is shorter).
    pub(crate) fn due(&mut self) -> Option<Vec<NodeId>> {
        if self.checked.elapsed() < CHECK_EVERY.min(self.forget_after).min(self.forget_transient_after) {
            return None;
        }
        self.checked = Instant::now();
        Some(self.since.iter().filter(|(id, t)| t.elapsed() >= self.grace(**id)).map(|(id, _)| *id).collect())
    }

    /// `id` was forgotten.
    pub(crate) fn forgotten(&mut self, id: NodeId) {
        self.since.remove(&id);
        self.transient.remove(&id);
    }

    /// The node down longest, if down at least the eviction grace.
    pub(crate) fn longest_down(&self) -> Option<NodeId> {
        let grace = EVICT_AFTER_MIN.min(self.forget_after);
        self.since.iter().filter(|(_, t)| t.elapsed() >= grace).min_by_key(|(_, t)| **t).map(|(id, _)| *id)
    }
}
