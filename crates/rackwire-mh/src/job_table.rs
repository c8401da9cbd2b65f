//! The management host's table of jobs: ranks claimed, rounds posted and read (see
//! [`crate::jobs`] for what a job is).

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use crate::jobs::{
    token_tag, JOBS_MAX, JOB_BLOB_BYTES_MAX, JOB_IDLE_DROP, JOB_RANKS_MAX, JOB_ROUNDS_KEPT, JOB_TOKEN_HEX_MAX,
    JOB_TOKEN_HEX_MIN,
};
use crate::proto::{JobMember, JobRound, NodeId};
use crate::MhError;

struct Job {
    size: u32,
    /// Each rank's node, and the session of that node that claimed it: a rank whose node's
    /// session is another now (its process ended, or ended and came back) is down.
    ranks: Vec<Option<(NodeId, u64)>>,
    rounds: BTreeMap<u64, Vec<Option<Vec<u8>>>>,
    /// Reached with a token (never started afresh).
    tokened: bool,
    /// When a rank last posted to it.
    last_post: Instant,
}

/// Where a job is kept: its name, and the tag of its token if it has one.
fn key(job: &str, token: Option<&str>) -> Result<String, MhError> {
    match token {
        None => Ok(job.to_string()),
        Some(t) => {
            let hex = t.len() % 2 == 0 && t.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex || !(JOB_TOKEN_HEX_MIN..=JOB_TOKEN_HEX_MAX).contains(&t.len()) {
                return Err(MhError::Refused(format!(
                    "a job token is {JOB_TOKEN_HEX_MIN} to {JOB_TOKEN_HEX_MAX} hex digits"
                )));
            }
            // A character no job name holds keeps the two kinds of key apart.
            Ok(format!("{job} {}", token_tag(t)))
        }
    }
}

/// One rank's post in one round of a job.
pub(crate) struct Post<'a> {
    pub job: &'a str,
    /// The job's token, if its launcher gave one.
    pub token: Option<&'a str>,
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
    /// `session` gives a node's live session, if it has one (`me`'s is the one posting).
    pub fn post(&mut self, me: NodeId, post: Post<'_>, session: impl Fn(NodeId) -> Option<u64>) -> Result<(), MhError> {
        let gone = |&(n, s): &(NodeId, u64)| session(n) != Some(s);
        let mine = session(me).ok_or_else(|| MhError::Refused("this node has no live session".into()))?;
        let Post { job: name, token, size, rank, round, blob } = post;
        let key = key(name, token)?;
        let job = key.as_str();
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
            .is_some_and(|j| !j.tokened && (j.ranks.iter().flatten().any(gone) || j.rounds.keys().any(|&k| k > 0)));
        if round == 0 && stale {
            self.jobs.remove(job);
        }
        if !self.jobs.contains_key(job) {
            if self.jobs.len() >= JOBS_MAX {
                self.jobs.retain(|_, j| !j.ranks.iter().flatten().all(gone));
            }
            if self.jobs.len() >= JOBS_MAX {
                let idlest = self.jobs.iter().min_by_key(|(_, j)| j.last_post).map(|(k, j)| (k.clone(), j.last_post));
                if let Some((k, _)) = idlest.filter(|(_, at)| at.elapsed() >= JOB_IDLE_DROP) {
                    self.jobs.remove(&k);
                }
            }
            if self.jobs.len() >= JOBS_MAX {
                return Err(MhError::Refused(format!("job limit ({JOBS_MAX}) reached")));
            }
            let tokened = token.is_some();
            self.jobs.insert(
                job.to_string(),
                Job {
                    size,
                    ranks: vec![None; size as usize],
                    rounds: BTreeMap::new(),
                    tokened,
                    last_post: Instant::now(),
                },
            );
        }
        let j = self.jobs.get_mut(job).expect("inserted above");
        if j.size != size {
            return Err(MhError::Refused(format!("job {name:?} has {} ranks, not {size}", j.size)));
        }
        // A rank is claimed once, by one session of one node: no other node, and no later
        // process of the same node, takes it.
        match j.ranks[rank as usize] {
            Some((n, _)) if n != me => {
                return Err(MhError::Refused(format!("rank {rank} of job {name:?} is node {n}, not this node ({me})")))
            }
            Some((_, s)) if s != mine => {
                return Err(MhError::Refused(format!(
                    "rank {rank} of job {name:?} was claimed by an earlier session of this node"
                )))
            }
            Some(_) => {}
            None if round == 0 => j.ranks[rank as usize] = Some((me, mine)),
            None => return Err(MhError::Refused(format!("rank {rank} never joined job {name:?} (round 0)"))),
        }
        if let Some((&oldest, _)) = j.rounds.first_key_value() {
            if round < oldest && j.rounds.len() as u64 >= JOB_ROUNDS_KEPT {
                return Err(MhError::Refused(format!("round {round} of job {name:?} is long over")));
            }
        }
        j.last_post = Instant::now();
        let slots = j.rounds.entry(round).or_insert_with(|| vec![None; size as usize]);
        slots[rank as usize] = Some(blob);
        while j.rounds.len() as u64 > JOB_ROUNDS_KEPT {
            j.rounds.pop_first();
        }
        Ok(())
    }

    /// What `round` of `job` holds so far, and which ranks are down.
    pub fn round(
        &self,
        name: &str,
        token: Option<&str>,
        round: u64,
        session: impl Fn(NodeId) -> Option<u64>,
    ) -> Result<JobRound, MhError> {
        let j = self.jobs.get(&key(name, token)?).ok_or_else(|| MhError::NotFound(format!("job {name:?}")))?;
        let slots = j.rounds.get(&round);
        if slots.is_none() && j.rounds.first_key_value().is_some_and(|(&oldest, _)| round < oldest) {
            return Err(MhError::Refused(format!("round {round} of job {name:?} is long over")));
        }
        let members = (0..j.size as usize)
            .map(|r| {
                j.ranks[r].map(|(node, _)| JobMember {
                    node,
                    blob: slots.and_then(|s| s[r].as_ref()).map(|b| crate::auth::to_hex(b)),
                })
            })
            .collect();
        let down = (0..j.size).filter(|&r| j.ranks[r as usize].is_some_and(|(n, s)| session(n) != Some(s))).collect();
        Ok(JobRound { size: j.size, members, first: 0, down })
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
        let all_up = |_| Some(1);
        jobs.post(10, Post { token: None, job: "j", size: 2, rank: 0, round: 0, blob: b"a".to_vec() }, all_up).unwrap();
        let r = jobs.round("j", None, 0, all_up).unwrap();
        assert_eq!(r.members[0].as_ref().unwrap().blob.as_deref(), Some("61"));
        assert!(r.members[1].is_none());
        assert!(
            matches!(jobs.post(11, Post { token: None, job: "j", size: 2, rank: 0, round: 0, blob: vec![] }, all_up), Err(MhError::Refused(m)) if m.contains("node 10"))
        );
        assert!(
            matches!(jobs.post(11, Post { token: None, job: "j", size: 3, rank: 1, round: 0, blob: vec![] }, all_up), Err(MhError::Refused(m)) if m.contains("2 ranks"))
        );
        assert!(
            jobs.post(11, Post { token: None, job: "j", size: 2, rank: 1, round: 1, blob: vec![] }, all_up).is_err(),
            "round 1 before joining"
        );
        jobs.post(11, Post { token: None, job: "j", size: 2, rank: 1, round: 0, blob: b"b".to_vec() }, all_up).unwrap();
        let r = jobs.round("j", None, 0, all_up).unwrap();
        assert!(r.members.iter().all(|m| m.as_ref().is_some_and(|m| m.blob.is_some())));
        // Node 11 goes down: rank 1 is reported, then a new run replaces the job.
        let eleven_down = |n| (n != 11).then_some(1);
        assert_eq!(jobs.round("j", None, 0, eleven_down).unwrap().down, vec![1]);
        jobs.post(12, Post { token: None, job: "j", size: 2, rank: 1, round: 0, blob: vec![] }, eleven_down).unwrap();
        let r = jobs.round("j", None, 0, eleven_down).unwrap();
        assert_eq!(r.members[1].as_ref().unwrap().node, 12);
        assert!(r.members[0].is_none(), "the stale run's rank 0 is gone");
        // A run that got past round 0 is replaced by a new run whose ranks are the same nodes.
        jobs.post(10, Post { token: None, job: "j", size: 2, rank: 0, round: 0, blob: vec![] }, all_up).unwrap();
        jobs.post(12, Post { token: None, job: "j", size: 2, rank: 1, round: 1, blob: b"old".to_vec() }, all_up)
            .unwrap();
        jobs.post(12, Post { token: None, job: "j", size: 2, rank: 1, round: 0, blob: vec![] }, all_up).unwrap();
        assert!(jobs.round("j", None, 1, all_up).unwrap().members[1].as_ref().unwrap().blob.is_none());
        assert!(jobs.round("j", None, 0, all_up).unwrap().members[0].is_none());
    }

    // Checks the bounds: only the last rounds are kept, an old round is refused by name, and
    // oversized blobs and bad ranks are refused.
    #[test]
    fn bounds_are_enforced() {
        let mut jobs = Jobs::default();
        let up = |_| Some(1);
        for round in 0..10 {
            jobs.post(1, Post { token: None, job: "k", size: 1, rank: 0, round, blob: vec![] }, up).unwrap();
        }
        assert!(jobs.round("k", None, 9, up).is_ok());
        assert!(matches!(jobs.round("k", None, 2, up), Err(MhError::Refused(m)) if m.contains("long over")));
        assert!(jobs
            .post(
                1,
                Post { token: None, job: "k", size: 1, rank: 0, round: 11, blob: vec![0; JOB_BLOB_BYTES_MAX + 1] },
                up
            )
            .is_err());
        assert!(jobs.post(1, Post { token: None, job: "k", size: 1, rank: 1, round: 11, blob: vec![] }, up).is_err());
        assert!(jobs.post(1, Post { token: None, job: "z", size: 0, rank: 0, round: 0, blob: vec![] }, up).is_err());
    }

    // Checks a job with a token (issue: any secret holder could take or reset a job's ranks,
    // job names being guessable): node 10 joins "j" as rank 0 with token T; node 66, without
    // T, posting as rank 1 of "j" (with no token, or another one) reaches another job — the
    // job with T still lacks rank 1, and node 66's rank-0 post there does not take or reset
    // anything; T's round is not readable without T. A late round-0 post of rank 0 after the
    // job got past round 0 changes nothing (no reset); a second process of node 10 (another
    // session) cannot claim rank 0 again. Malformed tokens are refused.
    #[test]
    fn a_job_with_a_token_is_its_ranks_alone() {
        let t = "ab".repeat(16);
        let mut jobs = Jobs::default();
        let up = |_| Some(1);
        fn post<'a>(token: Option<&'a str>, rank: u32, round: u64, blob: &[u8]) -> Post<'a> {
            Post { job: "j", token, size: 2, rank, round, blob: blob.to_vec() }
        }
        jobs.post(10, post(Some(&t), 0, 0, b"a"), up).unwrap();
        jobs.post(66, post(None, 1, 0, b"evil"), up).unwrap();
        jobs.post(66, post(Some(&"cd".repeat(16)), 0, 0, b"evil"), up).unwrap();
        let r = jobs.round("j", Some(&t), 0, up).unwrap();
        assert_eq!(r.members[0].as_ref().unwrap().node, 10);
        assert!(r.members[1].is_none(), "a node without the token took a rank");
        assert_eq!(jobs.round("j", None, 0, up).unwrap().members[1].as_ref().unwrap().node, 66, "another job");
        jobs.post(11, post(Some(&t), 1, 0, b"b"), up).unwrap();
        jobs.post(10, post(Some(&t), 0, 1, b"a1"), up).unwrap();
        jobs.post(10, post(Some(&t), 0, 0, b"late"), up).unwrap();
        let r = jobs.round("j", Some(&t), 1, up).unwrap();
        assert_eq!(r.members[0].as_ref().unwrap().blob.as_deref(), Some("6131"), "no reset by a late post");
        let second_session = |n| Some(if n == 10 { 2 } else { 1 });
        assert!(
            matches!(jobs.post(10, post(Some(&t), 0, 2, b""), second_session), Err(MhError::Refused(m)) if m.contains("earlier session"))
        );
        assert_eq!(jobs.round("j", Some(&t), 1, second_session).unwrap().down, vec![0], "its old session is gone");
        for bad in ["xyz".repeat(11), "ab".repeat(8), "ab".repeat(65)] {
            assert!(jobs.post(10, post(Some(&bad), 0, 0, b""), up).is_err(), "token {bad}");
        }
    }
}
