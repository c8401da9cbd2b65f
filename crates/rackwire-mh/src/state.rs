//! The management host's persistent state: in a folder, one JSON document replaced atomically
//! on change; in etcd, records (see `records`).

mod records;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use crate::proto::{GrantEntry, NodeId, NodeInfo, RegionEntry};
use crate::MhError;

const STATE_FILE: &str = "state.json";
/// The state before the last change: what a damaged state file gives way to.
const STATE_PREVIOUS: &str = "state.json.prev";

/// The id a loaded state hands out next: at least 1 and past every node it records (a state
/// whose `next_id` is behind its nodes would hand an id out twice).
fn next_id_after(state: &State) -> NodeId {
    let past_nodes = state.nodes.keys().max().map_or(1, |m| m.saturating_add(1));
    state.next_id.max(1).max(past_nodes)
}

/// The state in `path`: None when there is no file, an error naming it when it is damaged.
fn read_state(path: &Path) -> Result<Option<State>, MhError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let mut state: State = serde_json::from_slice(&bytes)
                .map_err(|e| MhError::Config(format!("state file {} is damaged: {e}", path.display())))?;
            state.next_id = next_id_after(&state);
            Ok(Some(state))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(MhError::Config(format!("state file {}: {e}", path.display()))),
    }
}
/// The state's key under the fabric's etcd prefix.
const STATE_KEY: &str = "state";

/// Everything the management host must not forget.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct State {
    /// The next node id to give out (ids start at 1; 0 is "no node").
    pub next_id: NodeId,
    pub nodes: BTreeMap<NodeId, NodeInfo>,
    pub regions: BTreeMap<String, RegionEntry>,
    pub grants: Vec<GrantEntry>,
    /// Ids of nodes forgotten (their records dropped): never given back, not even to a node
    /// that names one as the id it had (at most [`RETIRED_IDS_MAX`], the oldest dropped).
    #[serde(default)]
    pub retired: std::collections::BTreeSet<NodeId>,
}

/// Retired ids kept, at most (see [`State::retired`]).
pub(crate) const RETIRED_IDS_MAX: usize = 65536;

impl State {
    /// Whether a node the state has no record of may have `id` again, the id it names as the
    /// one it had (this management host lost its state since): not one on record or retired,
    /// not 0, and not the last.
    pub(crate) fn may_return_as(&self, id: NodeId) -> bool {
        id != 0 && id < NodeId::MAX - 1 && !self.nodes.contains_key(&id) && !self.retired.contains(&id)
    }

    /// Remember `ids` as retired (see [`State::retired`]).
    pub(crate) fn retire(&mut self, ids: &[NodeId]) {
        self.retired.extend(ids.iter().copied());
        while self.retired.len() > RETIRED_IDS_MAX {
            self.retired.pop_first();
        }
    }
}

/// The state and where it lives: a file, memory only, or etcd while this host leads.
#[derive(Debug)]
pub(crate) struct Store {
    dir: Option<PathBuf>,
    /// The etcd term this host leads in, when its state lives in etcd.
    pub term: Option<Term>,
    pub state: State,
    /// The state as last kept (read or saved), to go back to when a save fails.
    saved: Vec<u8>,
    /// In etcd: the records as last kept (see `records`), and whether the state was
    /// read from the older single document (deleted by the first save).
    kept: Option<(records::Records, bool)>,
    /// The state as last kept, for readers (see [`View`]).
    view: View,
}

/// The state as last kept, shared with readers: requests that only read take it without
/// waiting for a change being saved (a write and an fsync under the store's lock), and see
/// only what is kept.
pub(crate) type View = Arc<RwLock<Arc<State>>>;

/// Leading in etcd: the client, who this host is (its leader key's value) and its lease.
#[derive(Debug)]
pub(crate) struct Term {
    pub etcd: crate::etcd::Etcd,
    pub me: String,
    pub lease: i64,
    /// Set when a write found another host leading.
    pub deposed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Where a fresh state's node ids start: somewhere in this range, at random.
pub(crate) const FIRST_ID_RANGE: std::ops::Range<u32> = 1 << 20..1 << 30;

impl State {
    /// An empty state. Its node ids start at a random point (of [`FIRST_ID_RANGE`]): a
    /// management host that lost its state then gives new nodes ids that the nodes still
    /// running from before do not hold (their peers remember their ids, keys and grants).
    fn fresh() -> State {
        let span = FIRST_ID_RANGE.end - FIRST_ID_RANGE.start;
        let first = FIRST_ID_RANGE.start + (crate::auth::random_u128() % u128::from(span)) as u32;
        State { next_id: first, ..State::default() }
    }
}

impl Store {
    /// Open the state in `dir` (created if missing); `None` keeps it in memory only. A damaged
    /// state file gives way to the last good copy beside it (the state before the last
    /// change), with a warning; only when both are damaged is it an error.
    pub fn open(dir: Option<&Path>) -> Result<Self, MhError> {
        let mut state = State::fresh();
        if let Some(dir) = dir {
            // The state holds every region's key: its folder is this user's, written by no one
            // else (who could otherwise replace the state file).
            crate::owner_only::create_folder(dir, crate::owner_only::Reach::Readable)
                .map_err(|e| MhError::Config(format!("state dir {e}")))?;
            match read_state(&dir.join(STATE_FILE)) {
                Ok(Some(s)) => state = s,
                Ok(None) => {}
                Err(damaged) => match read_state(&dir.join(STATE_PREVIOUS)) {
                    Ok(Some(s)) => {
                        tracing::warn!("{damaged}; starting from the last good copy {STATE_PREVIOUS}");
                        state = s;
                    }
                    _ => return Err(damaged),
                },
            }
        }
        Store::with(dir.map(Path::to_owned), None, state)
    }

    /// Back to what was last kept.
    fn restore(&mut self) {
        if let Ok(s) = serde_json::from_slice::<State>(&self.saved) {
            self.state = s;
        }
    }

    /// The state kept in etcd (empty if there is none yet), for a host that now leads: its
    /// records, or the single document an older version kept (rewritten as records by the
    /// first save).
    pub fn from_etcd(term: Term) -> Result<Self, MhError> {
        let recs = term.etcd.get_prefix(records::RECORDS_PREFIX)?;
        let (state, kept) = match records::to_state(&recs)? {
            Some(mut state) => {
                state.next_id = next_id_after(&state);
                let kept = recs.into_iter().collect();
                (state, (kept, false))
            }
            None => match term.etcd.get(STATE_KEY)? {
                Some(bytes) => {
                    let mut state: State = serde_json::from_slice(&bytes)
                        .map_err(|e| MhError::Config(format!("the state in etcd is damaged: {e}")))?;
                    state.next_id = next_id_after(&state);
                    (state, (Default::default(), true))
                }
                None => (State::fresh(), (Default::default(), false)),
            },
        };
        let mut store = Store::with(None, Some(term), state)?;
        store.kept = Some(kept);
        Ok(store)
    }

    fn with(dir: Option<PathBuf>, term: Option<Term>, state: State) -> Result<Self, MhError> {
        let saved = serde_json::to_vec(&state).map_err(|e| MhError::Protocol(e.to_string()))?;
        let view = Arc::new(RwLock::new(Arc::new(state.clone())));
        Ok(Store { dir, term, state, saved, view, kept: None })
    }

    /// Its readers' view.
    pub(crate) fn view(&self) -> View {
        self.view.clone()
    }

    /// Publish to `view` from now on (a host that took over keeps its readers' view).
    pub(crate) fn share_view(&mut self, view: View) {
        self.view = view;
        self.publish();
    }

    fn publish(&self) {
        *self.view.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(self.state.clone());
    }

    /// Keep the state (in etcd while leading; in a file: a temporary one, synced, then renamed
    /// over the old one, so a crash leaves either the old or the new state, never a torn one).
    /// When it cannot be kept, the change is undone in memory too.
    pub fn save(&mut self) -> Result<(), MhError> {
        let bytes = serde_json::to_vec_pretty(&self.state).map_err(|e| MhError::Protocol(e.to_string()))?;
        let kept = if self.term.is_some() { self.keep_records() } else { self.keep(&bytes) };
        match kept {
            Ok(()) => {
                self.saved = bytes;
                self.publish();
                Ok(())
            }
            Err(e) => {
                // Memory must not run ahead of what is kept: a change not kept is undone.
                self.restore();
                Err(e)
            }
        }
    }

    /// Keep the state in etcd: the records that changed since the last save, in fenced
    /// transactions of at most [`crate::etcd::TXN_OPS_MAX`] writes (one, for any single
    /// change but the first save of a state read from the older single document, or forgetting
    /// many nodes at once: those take several, each whole, in order).
    fn keep_records(&mut self) -> Result<(), MhError> {
        let Some(t) = &self.term else { return Ok(()) };
        let new = records::of(&self.state)?;
        let (old, legacy) = self.kept.take().unwrap_or_default();
        let (puts, mut deletes) = records::diff(&old, &new);
        if legacy {
            deletes.push(STATE_KEY.to_string());
        }
        let ops: Vec<Result<(String, Vec<u8>), String>> =
            puts.into_iter().map(Ok).chain(deletes.into_iter().map(Err)).collect();
        for chunk in ops.chunks(crate::etcd::TXN_OPS_MAX) {
            let puts: Vec<(String, Vec<u8>)> = chunk.iter().filter_map(|o| o.as_ref().ok().cloned()).collect();
            let dels: Vec<String> = chunk.iter().filter_map(|o| o.as_ref().err().cloned()).collect();
            match t.etcd.txn_if_leader(&t.me, t.lease, &puts, &dels) {
                Ok(true) => {}
                Ok(false) => {
                    self.kept = Some((old, legacy));
                    t.deposed.store(true, std::sync::atomic::Ordering::SeqCst);
                    return Err(MhError::Unavailable("this management host no longer leads".into()));
                }
                Err(e) => {
                    self.kept = Some((old, legacy));
                    return Err(e);
                }
            }
        }
        self.kept = Some((new, false));
        Ok(())
    }

    fn keep(&self, bytes: &[u8]) -> Result<(), MhError> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let tmp = dir.join(format!("{STATE_FILE}.tmp"));
        // Readable by the management host's user only: it holds every region's key. The folder
        // is synced after the rename, so the new name survives a crash too.
        let write = || -> std::io::Result<()> {
            use std::os::unix::fs::OpenOptionsExt;
            use std::os::unix::fs::PermissionsExt;
            let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            f.write_all(bytes)?;
            f.sync_all()?;
            // The state file now on disk becomes the last good copy.
            let (current, previous) = (dir.join(STATE_FILE), dir.join(STATE_PREVIOUS));
            if current.exists() {
                let _ = std::fs::remove_file(&previous);
                std::fs::hard_link(&current, &previous)?;
            }
            std::fs::rename(&tmp, current)?;
            std::fs::File::open(dir)?.sync_all()
        };
        write().map_err(|e| MhError::Unavailable(format!("saving state: {e}")))
    }
}
