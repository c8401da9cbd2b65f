//! What every session of the management host shares: the state and its view, the live
//! nodes, the sessions, the jobs, the admissions' counts — and the small helpers of its line
//! protocol (a line at most so long, JSON on it).

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::departed::Departed;
use crate::jobs::Jobs;
use crate::proto::*;
use crate::sessions::Sessions;
use crate::state::{Store, View};
use crate::{MhError, MH_LINE_BYTES_MAX};

/// Milliseconds since the Unix epoch (0 for a clock before it).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Read one line of at most [`MH_LINE_BYTES_MAX`] bytes. `Ok(None)` at end of stream.
pub(crate) fn read_line(r: &mut impl BufRead, buf: &mut String) -> std::io::Result<Option<()>> {
    read_line_max(r, buf, MH_LINE_BYTES_MAX)
}

/// One line of at most `max` bytes.
pub(crate) fn read_line_max(r: &mut impl BufRead, buf: &mut String, max: usize) -> std::io::Result<Option<()>> {
    buf.clear();
    let n = std::io::Read::take(r, max as u64 + 1).read_line(buf)?;
    if n == 0 {
        return Ok(None);
    }
    if n > max {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "line too long"));
    }
    Ok(Some(()))
}

pub(crate) fn write_json(w: &mut impl Write, v: &impl serde::Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()
}

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

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(line: &str) -> Result<T, MhError> {
    serde_json::from_str(line).map_err(|e| MhError::Protocol(e.to_string()))
}

pub(crate) fn io_err(e: std::io::Error) -> MhError {
    MhError::Unavailable(e.to_string())
}
