//! Several management hosts on one etcd: one leads and serves, the others stand by and take
//! over when it dies (see [`crate::etcd`] for the election and the fencing of writes).
//!
//! A standby neither listens nor answers: nodes, given every host's address, connect to the
//! one that accepts. On taking over, the new leader reads the state from etcd and listens;
//! nodes find it when their session breaks (within a heartbeat or two) and replay what they
//! told the old one (their registration, names and grant records), so nothing is lost.
//! Jobs' bootstrap rounds live in the leader's memory: a round under way when the leader dies
//! starts again.

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info, warn};

use crate::etcd::{Etcd, EtcdConfig, CAMPAIGN_EVERY, KEEPALIVE_EVERY, LEASE_TTL};
use crate::server::{accept_one, listen_on, reap_slow, MhHandle, ACCEPT_POLL};
use crate::shared::{lock, Shared};
use crate::state::{Store, Term};
use crate::{auth, ManagementHost, MhError};

impl ManagementHost {
    /// Stand by to lead the fabric whose state lives in etcd (`etcd`), serving on `listen`
    /// (a fixed address: nodes are told every host's) while this host leads. Its key pair is
    /// kept in `key_dir` (made there at first start); with none, it has a new one each run,
    /// which nodes that pinned the old one refuse.
    pub fn start_led(
        listen: &str,
        etcd: EtcdConfig,
        secret: &[u8],
        key_dir: Option<&std::path::Path>,
    ) -> Result<MhHandle, MhError> {
        if secret.len() < auth::SECRET_BYTES_MIN {
            return Err(MhError::Config(format!("the secret must be at least {} bytes", auth::SECRET_BYTES_MIN)));
        }
        let addr = listen
            .to_socket_addrs()
            .map_err(|e| MhError::Config(format!("listen address {listen}: {e}")))?
            .next()
            .ok_or_else(|| MhError::Config(format!("listen address {listen} resolves to nothing")))?;
        if addr.port() == 0 {
            return Err(MhError::Config("with etcd, the listen address needs a fixed port (nodes are told it)".into()));
        }
        // The host's key, kept in `key_dir` (else one for this run): nodes pin each host's key
        // at first use, per address, or are given the keys.
        let shared = Shared::new(secret, Store::open(None)?, crate::server::host_key(key_dir)?);
        let s = shared.clone();
        let etcd = Etcd::new(etcd);
        let thread = std::thread::Builder::new()
            .name("rw-mh-lead".into())
            .spawn(move || lead_loop(addr, etcd, s))
            .map_err(|e| MhError::Config(e.to_string()))?;
        info!(%addr, "management host standing by (etcd)");
        Ok(MhHandle { addr, shared, accept: Some(thread) })
    }
}

fn pause(shared: &Shared) {
    let until = Instant::now() + CAMPAIGN_EVERY;
    while Instant::now() < until && !shared.stopping.load(Ordering::SeqCst) {
        std::thread::sleep(ACCEPT_POLL);
    }
}

/// Campaign until elected, lead until the lease is lost (or stopped), step down, again.
fn lead_loop(addr: SocketAddr, etcd: Etcd, shared: Arc<Shared>) {
    let me = addr.to_string();
    while !shared.stopping.load(Ordering::SeqCst) {
        let lease = match etcd.grant() {
            Ok(l) => l,
            Err(e) => {
                debug!("etcd: {e}");
                pause(&shared);
                continue;
            }
        };
        match etcd.campaign(&me, lease) {
            Ok(true) => {}
            other => {
                if let Err(e) = other {
                    debug!("campaign: {e}");
                }
                let _ = etcd.revoke(lease);
                pause(&shared);
                continue;
            }
        }
        let deposed = Arc::new(AtomicBool::new(false));
        let term = Term { etcd: etcd.clone(), me: me.clone(), lease, deposed: deposed.clone() };
        let listener = Store::from_etcd(term).and_then(|store| {
            shared.took_over(store);
            let l = listen_on(&addr.to_string())?;
            l.set_nonblocking(true).map_err(|e| MhError::Config(e.to_string()))?;
            Ok(l)
        });
        let listener = match listener {
            Ok(l) => l,
            Err(e) => {
                warn!("elected but cannot lead: {e}");
                let _ = etcd.revoke(lease);
                pause(&shared);
                continue;
            }
        };
        info!(%addr, "leading the fabric (etcd)");
        serve(&listener, &etcd, lease, &deposed, &shared);
        drop(listener);
        shared.close_sessions();
        lock(&shared.live).clear();
        let _ = etcd.revoke(lease);
        if !shared.stopping.load(Ordering::SeqCst) {
            warn!(%addr, "no longer leading; standing by");
        }
    }
}

/// Accept and serve while the lease holds.
fn serve(listener: &TcpListener, etcd: &Etcd, lease: i64, deposed: &AtomicBool, shared: &Arc<Shared>) {
    let (mut renewed, mut confirmed, mut reaped) = (Instant::now(), Instant::now(), Instant::now());
    while !shared.stopping.load(Ordering::SeqCst) && !deposed.load(Ordering::SeqCst) {
        if !accept_one(listener, shared) {
            std::thread::sleep(ACCEPT_POLL);
        }
        reap_slow(shared, &mut reaped);
        if renewed.elapsed() >= KEEPALIVE_EVERY {
            renewed = Instant::now();
            match etcd.keepalive(lease) {
                Ok(true) => confirmed = Instant::now(),
                Ok(false) => return,
                // Unsure whether it still holds: once it surely ran out, stop.
                Err(e) if confirmed.elapsed() >= LEASE_TTL => {
                    warn!("etcd unreachable for the whole lease: {e}");
                    return;
                }
                Err(_) => {}
            }
        }
    }
}
