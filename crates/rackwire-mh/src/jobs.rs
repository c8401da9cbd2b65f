//! Jobs: the management host's side of bootstrapping a group of ranks.
//!
//! A job is a name, a size N, and a table of which node is rank 0..N-1. Its ranks bootstrap
//! through numbered *rounds*: in each round every rank posts one small blob (its region
//! handles, or nothing at all for a barrier) and then asks for the round until every rank's
//! blob is there. The first round (0) fills the rank table. Rounds are numbered by the ranks
//! themselves, which call them in the same order, so no round needs to be closed: a rank can
//! only be one round ahead of the slowest (it cannot finish round k+1 before every rank posted
//! it, and a rank posts k+1 only after it read k), so keeping the last [`JOB_ROUNDS_KEPT`]
//! rounds is enough.
//!
//! Jobs live in memory only: they last as long as their ranks, and a restarted management host
//! makes a job in flight fail with a clear error rather than hang.

use std::collections::{BTreeMap, HashMap};

use crate::proto::{JobMember, JobRound, NodeId};
use crate::MhError;

/// The most jobs a management host holds at once (jobs whose ranks are all down are dropped
/// first to make room).
pub const JOBS_MAX: usize = 1024;
/// The most ranks in one job.
pub const JOB_RANKS_MAX: u32 = 1024;
/// The largest blob one rank posts in one round, in bytes.
pub const JOB_BLOB_BYTES_MAX: usize = 4096;
/// Rounds of one job kept (older ones are dropped; see the module documentation).
pub const JOB_ROUNDS_KEPT: u64 = 4;

struct Job {
    size: u32,
    ranks: Vec<Option<NodeId>>,
    rounds: BTreeMap<u64, Vec<Option<Vec<u8>>>>,
}

/// One rank's post in one round of a job.
pub(crate) struct Post<'a> {
    pub job: &'a str,
    pub size: u32,
    pub rank: u32,
    pub round: u64,
    pub blob: Vec<u8>,
}

/// Every job the management host knows.
#[derive(Default)]
pub(crate) struct Jobs {
    jobs: HashMap<String, Job>,
}

impl Jobs {
    /// Jobs known.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Record `blob` as `rank`'s post in `round` of `job` (of `size` ranks), from node `me`.
    /// `up` tells whether a node has a live session.
    pub fn post(&mut self, me: NodeId, post: Post<'_>, up: impl Fn(NodeId) -> bool) -> Result<(), MhError> {
        let Post { job, size, rank, round, blob } = post;
        if size == 0 || size > JOB_RANKS_MAX {
            return Err(MhError::Refused(format!("job size {size} outside 1..={JOB_RANKS_MAX}")));
        }
        if rank >= size {
            return Err(MhError::Refused(format!("rank {rank} outside 0..{size}")));
        }
        if blob.len() > JOB_BLOB_BYTES_MAX {
            return Err(MhError::Refused(format!("blob of {} bytes, at most {JOB_BLOB_BYTES_MAX}", blob.len())));
        }
        // A job left behind by an earlier run is started afresh by the first post of round 0
        // of a new run of the same name: the old run has a member down, or it got past round 0
        // (ranks of one run post round 0 once; a new run's ranks may come back as the same
        // nodes when they reuse their names).
        let stale = self
            .jobs
            .get(job)
            .is_some_and(|j| j.ranks.iter().flatten().any(|&n| !up(n)) || j.rounds.keys().any(|&k| k > 0));
        if round == 0 && stale {
            self.jobs.remove(job);
        }
        if !self.jobs.contains_key(job) {
            if self.jobs.len() >= JOBS_MAX {
                self.jobs.retain(|_, j| j.ranks.iter().flatten().any(|&n| up(n)));
            }
            if self.jobs.len() >= JOBS_MAX {
                return Err(MhError::Refused(format!("job limit ({JOBS_MAX}) reached")));
            }
            self.jobs.insert(job.to_string(), Job { size, ranks: vec![None; size as usize], rounds: BTreeMap::new() });
        }
        let j = self.jobs.get_mut(job).expect("inserted above");
        if j.size != size {
            return Err(MhError::Refused(format!("job {job:?} has {} ranks, not {size}", j.size)));
        }
        match j.ranks[rank as usize] {
            Some(n) if n != me => {
                return Err(MhError::Refused(format!("rank {rank} of job {job:?} is node {n}, not this node ({me})")))
            }
            Some(_) => {}
            None if round == 0 => j.ranks[rank as usize] = Some(me),
            None => return Err(MhError::Refused(format!("rank {rank} never joined job {job:?} (round 0)"))),
        }
        if let Some((&oldest, _)) = j.rounds.first_key_value() {
            if round < oldest && j.rounds.len() as u64 >= JOB_ROUNDS_KEPT {
                return Err(MhError::Refused(format!("round {round} of job {job:?} is long over")));
            }
        }
        let slots = j.rounds.entry(round).or_insert_with(|| vec![None; size as usize]);
        slots[rank as usize] = Some(blob);
        while j.rounds.len() as u64 > JOB_ROUNDS_KEPT {
            j.rounds.pop_first();
        }
        Ok(())
    }

    /// What `round` of `job` holds so far, and which ranks are down.
    pub fn round(&self, job: &str, round: u64, up: impl Fn(NodeId) -> bool) -> Result<JobRound, MhError> {
        let j = self.jobs.get(job).ok_or_else(|| MhError::NotFound(format!("job {job:?}")))?;
        let slots = j.rounds.get(&round);
        if slots.is_none() && j.rounds.first_key_value().is_some_and(|(&oldest, _)| round < oldest) {
            return Err(MhError::Refused(format!("round {round} of job {job:?} is long over")));
        }
        let members = (0..j.size as usize)
            .map(|r| {
                j.ranks[r].map(|node| JobMember {
                    node,
                    blob: slots.and_then(|s| s[r].as_ref()).map(|b| crate::auth::to_hex(b)),
                })
            })
            .collect();
        let down = (0..j.size).filter(|&r| j.ranks[r as usize].is_some_and(|n| !up(n))).collect();
        Ok(JobRound { size: j.size, members, down })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the life of a job: round 0 fills the rank table, a round is complete once every
    // rank posted, a rank cannot be taken by another node, a size must match, a down member
    // is reported, and a new run of the same name after it replaces the stale job.
    #[test]
    fn rounds_fill_and_stale_jobs_are_replaced() {
        let mut jobs = Jobs::default();
        let all_up = |_| true;
        jobs.post(10, Post { job: "j", size: 2, rank: 0, round: 0, blob: b"a".to_vec() }, all_up).unwrap();
        let r = jobs.round("j", 0, all_up).unwrap();
        assert_eq!(r.members[0].as_ref().unwrap().blob.as_deref(), Some("61"));
        assert!(r.members[1].is_none());
        assert!(
            matches!(jobs.post(11, Post { job: "j", size: 2, rank: 0, round: 0, blob: vec![] }, all_up), Err(MhError::Refused(m)) if m.contains("node 10"))
        );
        assert!(
            matches!(jobs.post(11, Post { job: "j", size: 3, rank: 1, round: 0, blob: vec![] }, all_up), Err(MhError::Refused(m)) if m.contains("2 ranks"))
        );
        assert!(
            jobs.post(11, Post { job: "j", size: 2, rank: 1, round: 1, blob: vec![] }, all_up).is_err(),
            "round 1 before joining"
        );
        jobs.post(11, Post { job: "j", size: 2, rank: 1, round: 0, blob: b"b".to_vec() }, all_up).unwrap();
        let r = jobs.round("j", 0, all_up).unwrap();
        assert!(r.members.iter().all(|m| m.as_ref().is_some_and(|m| m.blob.is_some())));
        // Node 11 goes down: rank 1 is reported, then a new run replaces the job.
        let eleven_down = |n| n != 11;
        assert_eq!(jobs.round("j", 0, eleven_down).unwrap().down, vec![1]);
        jobs.post(12, Post { job: "j", size: 2, rank: 1, round: 0, blob: vec![] }, eleven_down).unwrap();
        let r = jobs.round("j", 0, eleven_down).unwrap();
        assert_eq!(r.members[1].as_ref().unwrap().node, 12);
        assert!(r.members[0].is_none(), "the stale run's rank 0 is gone");
        // A run that got past round 0 is replaced by a new run whose ranks are the same nodes.
        jobs.post(10, Post { job: "j", size: 2, rank: 0, round: 0, blob: vec![] }, all_up).unwrap();
        jobs.post(12, Post { job: "j", size: 2, rank: 1, round: 1, blob: b"old".to_vec() }, all_up).unwrap();
        jobs.post(12, Post { job: "j", size: 2, rank: 1, round: 0, blob: vec![] }, all_up).unwrap();
        assert!(jobs.round("j", 1, all_up).unwrap().members[1].as_ref().unwrap().blob.is_none());
        assert!(jobs.round("j", 0, all_up).unwrap().members[0].is_none());
    }

    // Checks the bounds: only the last rounds are kept, an old round is refused by name, and
    // oversized blobs and bad ranks are refused.
    #[test]
    fn bounds_are_enforced() {
        let mut jobs = Jobs::default();
        let up = |_| true;
        for round in 0..10 {
            jobs.post(1, Post { job: "k", size: 1, rank: 0, round, blob: vec![] }, up).unwrap();
        }
        assert!(jobs.round("k", 9, up).is_ok());
        assert!(matches!(jobs.round("k", 2, up), Err(MhError::Refused(m)) if m.contains("long over")));
        assert!(jobs
            .post(1, Post { job: "k", size: 1, rank: 0, round: 11, blob: vec![0; JOB_BLOB_BYTES_MAX + 1] }, up)
            .is_err());
        assert!(jobs.post(1, Post { job: "k", size: 1, rank: 1, round: 11, blob: vec![] }, up).is_err());
        assert!(jobs.post(1, Post { job: "z", size: 0, rank: 0, round: 0, blob: vec![] }, up).is_err());
    }
}
