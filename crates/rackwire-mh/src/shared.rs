//! What every session of the management host shares: the state and its view, the live
//! nodes, the sessions, the jobs, the admissions' counts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use crate::departed::Departed;
use crate::job_table::Jobs;
use crate::proto::*;
use crate::sessions::Sessions;
use crate::state::{Store, View};
use crate::MhError;

pub(crate) struct Live {
    pub(crate) session: u64,
    pub(crate) last_seen_ms: u64,
    /// The address the session comes from: what the management host can verify of where a
    /// node is (see [`claims_anothers_address`]).
    pub(crate) from: Option<std::net::IpAddr>,
}

pub(crate) struct Shared {
    pub(crate) secret: Vec<u8>,
    /// This host's key pair: it signs every admission, and nodes pin its public half.
    pub(crate) host_key: crate::identity::Identity,
    /// Admissions by outcome (`admitted`, or why refused), for the metrics.
    pub(crate) admissions: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    pub(crate) jobs: Mutex<Jobs>,
    pub(crate) store: Mutex<Store>,
    pub(crate) live: Mutex<HashMap<NodeId, Live>>,
    /// Nodes whose last session their side closed (see [`NodeStatus::ended`]).
    pub(crate) ended: Mutex<std::collections::HashSet<NodeId>>,
    pub(crate) sessions: Mutex<Sessions>,
    /// Since when nodes are down, to forget those gone for good.
    pub(crate) departed: Mutex<Departed>,
    /// The state as last kept, for requests that only read.
    pub(crate) view: View,
    pub(crate) next_session: AtomicU64,
    pub(crate) stopping: AtomicBool,
}

impl Shared {
    pub(crate) fn new(secret: &[u8], store: Store, host_key: crate::identity::Identity) -> Arc<Shared> {
        let departed = Departed::new(store.state.nodes.values().map(|n| (n.id, n.transient)));
        let view = store.view();
        Arc::new(Shared {
            secret: secret.to_vec(),
            host_key,
            admissions: Mutex::new(Default::default()),
            jobs: Mutex::new(Jobs::default()),
            store: Mutex::new(store),
            live: Mutex::new(HashMap::new()),
            ended: Mutex::new(Default::default()),
            sessions: Mutex::new(Sessions::default()),
            departed: Mutex::new(departed),
            view,
            next_session: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
        })
    }

    /// Lead with `store` (read from where the leader before kept it): its nodes count as down
    /// from now.
    pub(crate) fn took_over(&self, mut store: Store) {
        let known = store.state.nodes.values().map(|n| (n.id, n.transient));
        lock(&self.departed).restart(known);
        store.share_view(self.view.clone());
        *lock(&self.store) = store;
    }

    /// Close every session (their nodes reconnect, to whichever host leads then).
    pub(crate) fn close_sessions(&self) {
        lock(&self.sessions).shut_all();
    }
}

/// Lock `m`, taking the value of a poisoned lock (a panicked holder left it consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One JSON value from a line.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, MhError> {
    serde_json::from_str(line).map_err(|e| MhError::Protocol(e.to_string()))
}

/// The error of a broken connection: the management host is unavailable.
pub(crate) fn io_err(e: std::io::Error) -> MhError {
    MhError::Unavailable(e.to_string())
}
