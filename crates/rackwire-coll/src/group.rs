//! A group: the ranks of one job, how they find each other, and their shared windows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rackwire::{Access, Conn, Fabric, FabricConfig, NodeId, Region, RemoteRegion, REMOTE_REGION_BYTES};

use crate::channel::{Channels, JobKey};
use crate::placement::{check, Placement};
use crate::CollError;

/// Default bound on how long a group call waits for the other ranks.
pub const GROUP_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// The first pause between two looks at a bootstrap round at the management host.
const BOOTSTRAP_POLL_MIN: Duration = Duration::from_micros(200);
/// The longest pause between two looks at a bootstrap round.
const BOOTSTRAP_POLL_MAX: Duration = Duration::from_millis(20);

/// How a group behaves.
#[derive(Clone, Debug)]
pub struct GroupConfig {
    /// How long any group call (joining included) waits for the other ranks before it fails
    /// with [`CollError::Timeout`] (`RACKWIRE_GROUP_TIMEOUT_MS`).
    pub timeout: Duration,
    /// The token the job's launcher handed its ranks (`RACKWIRE_JOB_TOKEN`; `rackwire launch`
    /// makes one per job): with it, the job is its ranks' alone at the management host —
    /// nobody without it can take a rank or start the job afresh. Without it the job is open
    /// to every node of the fabric under its name.
    pub job_token: Option<String>,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig { timeout: GROUP_TIMEOUT_DEFAULT, job_token: None }
    }
}

impl GroupConfig {
    /// The defaults, with `RACKWIRE_GROUP_TIMEOUT_MS` and `RACKWIRE_JOB_TOKEN` over them.
    pub fn from_env() -> Result<GroupConfig, CollError> {
        let mut c = GroupConfig::default();
        if let Ok(t) = std::env::var(rackwire::vars::JOB_TOKEN) {
            c.job_token = Some(t);
        }
        if let Ok(v) = std::env::var(rackwire::vars::GROUP_TIMEOUT_MS) {
            let ms: u64 = v
                .parse()
                .map_err(|_| CollError::Config(format!("{}={v:?}: milliseconds", rackwire::vars::GROUP_TIMEOUT_MS)))?;
            c.timeout = Duration::from_millis(ms.max(1));
        }
        Ok(c)
    }
}

/// A region every rank of a group allocated with the same length, with every rank's handle.
pub struct SymmetricRegion {
    /// This rank's part.
    pub region: Region,
    remotes: Vec<RemoteRegion>,
}

impl SymmetricRegion {
    /// Rank `r`'s part, to pass to [`Conn`]'s one-sided calls.
    pub fn remote(&self, r: usize) -> Option<&RemoteRegion> {
        self.remotes.get(r)
    }

    /// Every rank's part, by rank.
    pub fn remotes(&self) -> &[RemoteRegion] {
        &self.remotes
    }
}

impl std::fmt::Debug for SymmetricRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SymmetricRegion").field("len", &self.region.len()).field("ranks", &self.remotes.len()).finish()
    }
}

/// N processes that are ranks 0..N-1 of one named job on a fabric.
///
/// Group calls are collective: every rank makes the same calls in the same order (with the
/// same root and sizes that agree, as in MPI). A call fails with a clear error, never hangs:
/// [`CollError::RankGone`] when a rank's process ended, [`CollError::Timeout`] when ranks did
/// not take part within the configured time.
pub struct Group {
    pub(crate) ch: Channels,
    rank: usize,
    size: usize,
    /// Bootstrap rounds used so far at the management host.
    round: u64,
    /// Scratch for collectives that combine what they receive.
    pub(crate) scratch: Vec<u64>,
    /// Vectors the collectives' steps reuse.
    pub(crate) reuse: crate::reuse::Reuse,
    /// The group was left (its last barrier ran).
    left: bool,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("job", &self.ch.job.name)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl Group {
    /// Join the fabric and the job as the environment says: the fabric from
    /// [`FabricConfig::from_env`] (unless `RACKWIRE_NAME` is set, a transient node named
    /// `JOB.RANK-KEY`, see [`FabricConfig::transient`]), the rank, size and job from
    /// [`Placement::from_env`].
    pub fn from_env() -> Result<Group, CollError> {
        let p = Placement::from_env()?;
        let group = GroupConfig::from_env()?;
        let mut cfg = FabricConfig::from_env()?;
        if std::env::var_os(rackwire::vars::NAME).is_none() {
            // With a token, the names carry its tag: nobody without it can take them first.
            cfg.name = match &group.job_token {
                Some(t) => format!("{}.{}.{}", p.job, p.rank, &rackwire::job_token_tag(t)[..8]),
                None => format!("{}.{}", p.job, p.rank),
            };
        }
        let fabric = Arc::new(Fabric::join(cfg)?);
        Group::join_with(fabric, &p.job, p.rank, p.size, group)
    }

    /// Join `job` as `rank` of `size` on `fabric`, with the default configuration.
    pub fn join(fabric: Arc<Fabric>, job: &str, rank: usize, size: usize) -> Result<Group, CollError> {
        Group::join_with(fabric, job, rank, size, GroupConfig::from_env()?)
    }

    /// [`Group::join`] with a configuration.
    pub fn join_with(
        fabric: Arc<Fabric>,
        job: &str,
        rank: usize,
        size: usize,
        cfg: GroupConfig,
    ) -> Result<Group, CollError> {
        check(rank, size)?;
        let deadline = Instant::now() + cfg.timeout;
        // Round 0: the rank table.
        let job = JobKey { name: job.to_string(), token: cfg.job_token.clone() };
        let table = bootstrap(&fabric, &job, size, rank, 0, &[], deadline)?;
        let nodes: Vec<NodeId> = table.iter().map(|(n, _)| *n).collect();
        // Round 1: the windows, granted before their handles are out.
        let window = Channels::alloc_window(&fabric, &nodes, rank)?;
        let posted = bootstrap(&fabric, &job, size, rank, 1, &window.handle().to_bytes(), deadline)?;
        let remotes = parse_handles(&posted)?;
        let ch = Channels::connect(fabric, rank, nodes, window, remotes, job, cfg.timeout)?;
        let mut g = Group { ch, rank, size, round: 1, scratch: Vec::new(), reuse: Default::default(), left: false };
        // Everyone connected before anyone returns: the first collective finds its peers.
        g.barrier()?;
        Ok(g)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.ch.job.name
    }

    /// The fabric this group lives on.
    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.ch.fabric
    }

    /// The node that is rank `r`.
    pub fn node(&self, r: usize) -> Option<NodeId> {
        self.ch.nodes.get(r).copied()
    }

    /// The connection to rank `r` (none to this rank itself), for one's own one-sided calls.
    pub fn conn(&self, r: usize) -> Option<&Conn> {
        self.ch.conn(r)
    }

    /// Which transport reaches rank `r` (`shm`, `edge`; `self` for this rank).
    pub fn transport(&self, r: usize) -> Option<&'static str> {
        if r == self.rank {
            return Some("self");
        }
        self.conn(r).map(|c| c.transport())
    }

    /// Allocate a region of `len` bytes on every rank, granted `access` to every other rank,
    /// and learn every rank's handle, in one collective call.
    pub fn alloc_symmetric(&mut self, len: u64, access: Access) -> Result<SymmetricRegion, CollError> {
        let region = self.ch.fabric.alloc(len, access)?;
        for (r, &node) in self.ch.nodes.iter().enumerate() {
            if r != self.rank {
                region.grant(node, access)?;
            }
        }
        let posted = self.bootstrap_round(&region.handle().to_bytes())?;
        let remotes = parse_handles(&posted)?;
        if let Some((r, h)) = remotes.iter().enumerate().find(|(_, h)| h.len() != len) {
            return Err(CollError::BadArgument(format!("rank {r} allocated {} bytes, this rank {len}", h.len())));
        }
        Ok(SymmetricRegion { region, remotes })
    }

    /// Every rank posts a small blob (at most 4096 bytes) through the management host and gets
    /// everyone's, by rank: for exchanging handles and names at setup, not for data.
    pub fn allgather_blobs(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, CollError> {
        Ok(self.bootstrap_round(blob)?.into_iter().map(|(_, b)| b).collect())
    }

    fn bootstrap_round(&mut self, blob: &[u8]) -> Result<Vec<(NodeId, Vec<u8>)>, CollError> {
        self.round += 1;
        self.ch.mh_round = self.round;
        let deadline = Instant::now() + self.ch.timeout;
        bootstrap(&self.ch.fabric, &self.ch.job, self.size, self.rank, self.round, blob, deadline)
    }

    /// Leave the group, together with the other ranks: a last barrier (so no rank goes while
    /// another still sends to it), then wait for this rank's operations still in flight.
    /// Dropping a group does the same, ignoring errors.
    pub fn leave(mut self) -> Result<(), CollError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), CollError> {
        if std::mem::replace(&mut self.left, true) {
            return Ok(());
        }
        self.barrier()?;
        // After the barrier every rank is done with the group: a peer that already went after
        // its own barrier has taken everything this rank sent it.
        match self.ch.drain() {
            Err(CollError::RankGone { .. }) | Ok(()) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            tracing::debug!(rank = self.rank, "leaving the group: {e}");
        }
    }
}

fn parse_handles(posted: &[(NodeId, Vec<u8>)]) -> Result<Vec<RemoteRegion>, CollError> {
    posted
        .iter()
        .enumerate()
        .map(|(r, (node, b))| {
            if b.len() != REMOTE_REGION_BYTES {
                return Err(CollError::Config(format!("rank {r} posted {} bytes, not a region handle", b.len())));
            }
            let h = RemoteRegion::from_bytes(b)?;
            if h.node() != *node {
                return Err(CollError::Config(format!("rank {r} posted a handle of node {}, not its own", h.node())));
            }
            Ok(h)
        })
        .collect()
}

/// Post `blob` in `round` and wait until every rank has: every rank's node and blob.
fn bootstrap(
    fabric: &Fabric,
    job: &JobKey,
    size: usize,
    rank: usize,
    round: u64,
    blob: &[u8],
    deadline: Instant,
) -> Result<Vec<(NodeId, Vec<u8>)>, CollError> {
    let start = Instant::now();
    fabric.job_post(&job.name, job.token.as_deref(), size as u32, rank as u32, round, blob)?;
    let mut pause = BOOTSTRAP_POLL_MIN;
    loop {
        let got = fabric.job_round(&job.name, job.token.as_deref(), round)?;
        if let Some(&r) = got.down.first() {
            let node = got.members[r as usize].as_ref().map_or(0, |m| m.node);
            return Err(CollError::RankGone { rank: r as usize, node });
        }
        let missing: Vec<usize> = (0..size)
            .filter(|&r| got.members.get(r).is_none_or(|m| m.as_ref().is_none_or(|m| m.blob.is_none())))
            .collect();
        if missing.is_empty() {
            return got
                .members
                .into_iter()
                .enumerate()
                .map(|(r, m)| {
                    let m = m.expect("checked above");
                    let blob = from_hex(m.blob.as_deref().unwrap_or_default())
                        .ok_or_else(|| CollError::Config(format!("rank {r}'s blob is not hex")))?;
                    Ok((m.node, blob))
                })
                .collect();
        }
        if Instant::now() >= deadline {
            return Err(CollError::Timeout {
                during: if round == 0 { "joining the group" } else { "a bootstrap exchange" },
                ranks: missing,
                waited_ms: start.elapsed().as_millis() as u64,
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(BOOTSTRAP_POLL_MAX);
    }
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}
