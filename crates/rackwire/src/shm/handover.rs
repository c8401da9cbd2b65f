//! What a peer's map request is handed: the region's memory, writable for a grant with store
//! rights and read-only otherwise — and when the memory must move first.
//!
//! A read-only descriptor holds only because the memory is sealed against new writable
//! mappings before it is handed out ([`SharedMem::readonly_fd`]): a peer of the same user can
//! change the file's mode and reopen it for writing, but the seal refuses it every way to
//! write. Mappings made before the seal (the owner's, writers already mapped) go on writing.
//! A writer that asks after the seal gets the memory only once it has moved to fresh,
//! unsealed memory ([`migrate`]: every peer maps again on its next access). So that readers
//! and writers asking in turn do not move the memory again and again, readers wait after such
//! a move until the writers that had it mapped have mapped it again, at most
//! [`WRITERS_REMAP_GRACE`]: the memory is then sealed once, after them.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rackwire_proto::OwnIdSet;
use rackwire_shm::ControlSocket;
use tracing::debug;

use super::control::{send, PeerMsg};
use crate::grants::{RegionInner, WritersFirst};
use crate::node::Node;
use crate::region::migrate;
use crate::sync::lock;
use crate::{Access, NodeId};

/// How long readers wait, after the memory moved for a writer, for the writers that had it
/// mapped to map it again (each does on its next access); past it, the first reader seals.
pub(crate) const WRITERS_REMAP_GRACE: Duration = Duration::from_millis(20);

/// The longest readers wait for a move made for a writer (a move waits for each mapped peer's
/// unmap at most [`crate::REVOKE_ACK_TIMEOUT`]).
const MOVE_WAIT_MAX: Duration = Duration::from_secs(30);

/// What became of a map request.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Handover {
    /// The descriptor went to the peer.
    Sent,
    /// Not now: the memory moves (or writers are mapping it again); the peer asks again.
    Later,
    /// The memory must move to fresh memory first (the peer asks again meanwhile).
    MustMove,
}

/// Answer map request `req` from `peer`, whose grant is `grant`, on `sock`, with `r`'s memory
/// (called with the region's access list locked, after the grant allowed the request).
pub(super) fn hand_over(
    sock: &ControlSocket,
    r: &RegionInner,
    req: u64,
    peer: NodeId,
    grant: Access,
) -> Result<Handover, crate::Error> {
    let mem = r.mem.lock();
    let granted = PeerMsg::MapGranted { req, access: grant.bits() };
    if grant.stores() {
        if mem.write_sealed() {
            return Ok(Handover::MustMove);
        }
        send(sock, &granted, &[mem.fd()])?;
        lock(&r.writers_first).waiting.remove(&peer);
        return Ok(Handover::Sent);
    }
    {
        let mut w = lock(&r.writers_first);
        match w.until {
            Some(t) if Instant::now() < t && !w.waiting.is_empty() => return Ok(Handover::Later),
            Some(_) => *w = WritersFirst::default(),
            None => {}
        }
    }
    // Sealing fails only when someone sealed the seals (a writer may): fresh memory then.
    match mem.readonly_fd() {
        Ok(ro) => {
            send(sock, &granted, &[ro.as_fd()])?;
            Ok(Handover::Sent)
        }
        Err(e) => {
            debug!(region = r.id, "cannot seal the region for a reader ({e}); it moves");
            Ok(Handover::MustMove)
        }
    }
}

/// Move `r` to fresh memory in the background (unless a move is under way), for `peer`'s
/// request: the writers mapped now, and `peer` if it may write, are waited for by readers
/// afterwards (see the module documentation).
pub(super) fn move_for(fabric: &Arc<Node>, r: &Arc<RegionInner>, peer: NodeId) {
    if r.migrating.load(Ordering::SeqCst) {
        return;
    }
    let writers: OwnIdSet<NodeId> = {
        let acl = lock(&r.acl);
        let writers = acl.mapped_by.iter().copied().chain([peer]);
        writers.filter(|p| acl.grants.get(p).is_some_and(|g| g.stores())).collect()
    };
    // Readers wait from now: through the move (every request is told to come back while it
    // moves) and the writers' grace, which starts once it has moved.
    *lock(&r.writers_first) = WritersFirst { until: Some(Instant::now() + MOVE_WAIT_MAX), waiting: writers };
    let (fabric, region) = (fabric.clone(), r.clone());
    // Its own thread: the move asks every mapped peer to unmap and waits for their answers,
    // which the control threads (this request's among them) read.
    let spawned = std::thread::Builder::new().name("rw-region-move".into()).spawn(move || {
        let moved = migrate(&fabric, &region);
        let mut w = lock(&region.writers_first);
        if moved {
            w.until = Some(Instant::now() + WRITERS_REMAP_GRACE);
        } else {
            *w = WritersFirst::default();
        }
    });
    if spawned.is_err() {
        *lock(&r.writers_first) = WritersFirst::default();
    }
}
