//! The requests of an admitted session: reads answered from the state as last kept (in
//! pages), changes checked (what a node may register, publish and grant) and kept, jobs.

use std::net::SocketAddr;

use tracing::warn;

use crate::auth::from_hex;
use crate::job_table::Post;
use crate::proto::*;
use crate::shared::{lock, Shared};
use crate::{check_name, MhError, GRANTS_MAX, REGION_NAMES_MAX};

/// Answer a request that only reads, from the state as last kept (no waiting for a change
/// being saved).
fn read(shared: &Shared, req: Request) -> Result<Reply, MhError> {
    let st = shared.view.read().unwrap_or_else(|e| e.into_inner()).clone();
    match req {
        Request::Nodes { after } => {
            let live = lock(&shared.live);
            let ended = lock(&shared.ended);
            let from = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            let all = st.nodes.range((from, std::ops::Bound::Unbounded)).map(|(&id, info)| {
                let status = NodeStatus {
                    info: info.clone(),
                    up: live.contains_key(&id),
                    last_seen_ms: live.get(&id).map_or(0, |l| l.last_seen_ms),
                    ended: !live.contains_key(&id) && ended.contains(&id),
                };
                (id, status)
            });
            let (nodes, more_after) = page(all);
            Ok(Reply::Nodes { nodes, more_after, now_ms: Some(crate::line::now_ms()) })
        }
        Request::Resolve { node } => {
            let info = st.nodes.get(&node).cloned().ok_or_else(|| MhError::NotFound(format!("node {node}")))?;
            Ok(Reply::Node { info })
        }
        Request::ResolveName { name } => {
            let info = st
                .nodes
                .values()
                .find(|n| n.name == name)
                .cloned()
                .ok_or_else(|| MhError::NotFound(format!("node {name:?}")))?;
            Ok(Reply::Node { info })
        }
        Request::Lookup { name } => {
            let entry = st.regions.get(&name).cloned().ok_or_else(|| MhError::NotFound(format!("region {name:?}")))?;
            Ok(Reply::Region { entry })
        }
        Request::Regions { after_name, from_grant } => {
            let from = after_name.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            let names = st.regions.range::<String, _>((from, std::ops::Bound::Unbounded));
            let (regions, more_after_name) = page(names.map(|(n, e)| (n.clone(), e.clone())));
            let grants = st.grants.iter().enumerate().skip(from_grant).map(|(i, g)| (i, g.clone()));
            let (grants, last) = page(grants);
            Ok(Reply::Regions { regions, grants, more_after_name, more_from_grant: last.map(|i| i + 1) })
        }
        _ => Err(MhError::Protocol("not a read".into())),
    }
}

/// The entries of `all` (each with its key) that fit one page ([`crate::REPLY_PAGE_BYTES`] of
/// their JSON; always at least one), and the key of the last one taken if more follow.
fn page<K, T: serde::Serialize>(all: impl Iterator<Item = (K, T)>) -> (Vec<T>, Option<K>) {
    let mut out = Vec::new();
    let mut bytes = 0;
    let mut all = all.peekable();
    while let Some((k, t)) = all.next() {
        bytes += serde_json::to_vec(&t).map_or(0, |v| v.len()) + 1;
        out.push(t);
        if all.peek().is_some() && bytes >= crate::REPLY_PAGE_BYTES {
            return (out, Some(k));
        }
    }
    (out, None)
}

/// Prefixes of region names that belong to the node named after the slash (`vnic/NAME`: the
/// marker of NAME's virtual NIC).
const OWNED_NAME_PREFIXES: &[&str] = &["vnic"];

/// Links a node may register, at most.
const LINKS_MAX: usize = 64;
/// The longest host identity and shared-memory path a node may register.
const HOST_BYTES_MAX: usize = 256;
const PATH_BYTES_MAX: usize = 4096;

/// Whether node `me`, registering `info`, names what is another live node's (`from` gives a
/// node's session address, `None` when it is not live): a link is one socket, so another live
/// node's link is never; an address (any port) another live node registered may be named only
/// by a node whose session comes from where that node's does (nodes of one host share its
/// addresses; a node of another host naming it would co-own the address, and on virtual NICs
/// take its traffic). The reason, when refused.
pub(crate) fn claims_anothers_address<'a>(
    info: &NodeInfo,
    me: NodeId,
    nodes: impl Iterator<Item = &'a NodeInfo>,
    from: impl Fn(NodeId) -> Option<Option<std::net::IpAddr>>,
) -> Option<String> {
    let ip = |l: &String| l.parse::<SocketAddr>().ok().map(|a| a.ip());
    let mine = from(me).flatten();
    for n in nodes.filter(|n| n.id != me) {
        let Some(theirs) = from(n.id) else { continue };
        if let Some(l) = info.links.iter().find(|l| n.links.contains(l)) {
            return Some(format!("link {l} is node {}'s", n.name));
        }
        let shared_ip = info.links.iter().find(|l| n.links.iter().any(|m| ip(m).is_some_and(|a| Some(a) == ip(l))));
        if let Some(l) = shared_ip {
            if mine.is_none() || theirs != mine {
                return Some(format!(
                    "address {} is node {}'s, which reaches the management host from another address",
                    ip(l).map_or_else(String::new, |a| a.to_string()),
                    n.name
                ));
            }
        }
    }
    None
}

/// What a node registers is within bounds: a handful of links, each an `ip:port`; a host
/// identity and a path of sane length.
fn check_registration(info: &NodeInfo) -> Result<(), MhError> {
    let refuse = |why: String| Err(MhError::Refused(why));
    if info.links.len() > LINKS_MAX {
        return refuse(format!("at most {LINKS_MAX} links"));
    }
    if let Some(bad) = info.links.iter().find(|l| l.parse::<SocketAddr>().is_err()) {
        return refuse(format!("link {:?} is not an ip:port", bad.chars().take(64).collect::<String>()));
    }
    if info.host.len() > HOST_BYTES_MAX || info.shm_path.as_ref().is_some_and(|p| p.len() > PATH_BYTES_MAX) {
        return refuse(format!("host at most {HOST_BYTES_MAX} bytes, path at most {PATH_BYTES_MAX}"));
    }
    Ok(())
}

pub(crate) fn error_reply(e: &MhError) -> Reply {
    let kind = match e {
        MhError::NotFound(_) => "not_found",
        _ => "refused",
    };
    let message = match e {
        MhError::NotFound(m) | MhError::Refused(m) => m.clone(),
        other => other.to_string(),
    };
    Reply::Error { kind: kind.into(), message }
}

pub(crate) fn handle(shared: &Shared, me: NodeId, req: Request) -> Result<Reply, MhError> {
    let need_node = || {
        if me == 0 {
            Err(MhError::Refused("observers may not change state".into()))
        } else {
            Ok(())
        }
    };
    // Jobs live in memory beside the stored state, behind their own lock.
    match req {
        Request::JobPost { job, token, size, rank, round, blob } => {
            need_node()?;
            check_name(&job).map_err(|e| MhError::Refused(e.to_string()))?;
            let blob = from_hex(&blob).ok_or_else(|| MhError::Refused("blob is not hex".into()))?;
            let live = lock(&shared.live);
            let post = Post { job: &job, token: token.as_deref(), size, rank, round, blob };
            lock(&shared.jobs).post(me, post, |n| live.get(&n).map(|l| l.session))?;
            return Ok(Reply::Ok);
        }
        Request::JobRound { job, token, round, from_rank } => {
            check_name(&job).map_err(|e| MhError::Refused(e.to_string()))?;
            let live = lock(&shared.live);
            let round = lock(&shared.jobs).round(&job, token.as_deref(), round, |n| live.get(&n).map(|l| l.session))?;
            let round = round.page_from(from_rank);
            return Ok(Reply::Job { round });
        }
        Request::Heartbeat => return Ok(Reply::Ok),
        Request::Nodes { .. }
        | Request::Resolve { .. }
        | Request::ResolveName { .. }
        | Request::Lookup { .. }
        | Request::Regions { .. } => return read(shared, req),
        _ => {}
    }
    let mut store = lock(&shared.store);
    let st = &mut store.state;
    let reply = match req {
        Request::Register { mut info } => {
            need_node()?;
            let known = st.nodes.get(&me).ok_or_else(|| MhError::NotFound(format!("node {me}")))?;
            info.id = me;
            info.name = known.name.clone();
            info.key = known.key.clone();
            info.transient = known.transient;
            check_registration(&info)?;
            let live = lock(&shared.live);
            let taken = claims_anothers_address(&info, me, st.nodes.values(), |n| live.get(&n).map(|l| l.from));
            drop(live);
            if let Some(why) = taken {
                warn!(node = me, "registration refused: {why}");
                return Err(MhError::Refused(why));
            }
            if st.nodes.get(&me) == Some(&info) {
                return Ok(Reply::Ok);
            }
            st.nodes.insert(me, info);
            Reply::Ok
        }
        Request::Publish { entry } => {
            need_node()?;
            check_name(&entry.name).map_err(|e| MhError::Refused(e.to_string()))?;
            if entry.key.len() != 32 || from_hex(&entry.key).is_none() || entry.len == 0 {
                return Err(MhError::Refused("a region entry needs a 32-hex-digit key and a length".into()));
            }
            if entry.node != me {
                return Err(MhError::Refused("a node may publish only its own regions".into()));
            }
            // Names under `node/` speak for the node named after the slash (its virtual NIC's
            // marker, `vnic/NAME`): only that node may publish them.
            if let Some((_, owner)) = entry.name.split_once('/').filter(|(p, _)| OWNED_NAME_PREFIXES.contains(p)) {
                let my_name = st.nodes.get(&me).map(|n| n.name.as_str()).unwrap_or_default();
                if owner != my_name {
                    return Err(MhError::Refused(format!("name {:?} belongs to node {owner:?}", entry.name)));
                }
            }
            match st.regions.get(&entry.name) {
                Some(old) if old.node != me => {
                    return Err(MhError::Refused(format!("name {:?} is published by node {}", entry.name, old.node)))
                }
                Some(old) if *old == entry => return Ok(Reply::Ok),
                None if st.regions.len() >= REGION_NAMES_MAX => {
                    return Err(MhError::Refused("region name limit reached".into()))
                }
                None if st.regions.values().filter(|r| r.node == me).count() >= crate::NAMES_PER_NODE_MAX => {
                    return Err(MhError::Refused(format!(
                        "this node publishes {} names already, its most",
                        crate::NAMES_PER_NODE_MAX
                    )))
                }
                _ => {}
            }
            st.regions.insert(entry.name.clone(), entry);
            Reply::Ok
        }
        Request::Unpublish { name } => {
            need_node()?;
            match st.regions.get(&name) {
                Some(e) if e.node == me => {
                    st.regions.remove(&name);
                }
                Some(_) => return Err(MhError::Refused(format!("name {name:?} belongs to another node"))),
                None => return Err(MhError::NotFound(format!("region {name:?}"))),
            }
            Reply::Ok
        }
        Request::Grant { grant } => {
            need_node()?;
            if grant.node != me {
                return Err(MhError::Refused("a node may record grants only of its own regions".into()));
            }
            if let Some(g) =
                st.grants.iter_mut().find(|g| g.node == me && g.region == grant.region && g.peer == grant.peer)
            {
                if g.access == grant.access {
                    return Ok(Reply::Ok);
                }
                g.access = grant.access;
            } else if st.grants.len() >= GRANTS_MAX {
                return Err(MhError::Refused("grant limit reached".into()));
            } else if st.grants.iter().filter(|g| g.node == me).count() >= crate::GRANTS_PER_NODE_MAX {
                return Err(MhError::Refused(format!(
                    "this node records {} grants already, its most",
                    crate::GRANTS_PER_NODE_MAX
                )));
            } else {
                st.grants.push(grant);
            }
            Reply::Ok
        }
        Request::Revoke { region, peer } => {
            need_node()?;
            st.grants.retain(|g| !(g.node == me && g.region == region && g.peer == peer));
            Reply::Ok
        }
        Request::DropRegion { region } => {
            need_node()?;
            st.grants.retain(|g| !(g.node == me && g.region == region));
            st.regions.retain(|_, e| !(e.node == me && e.region == region));
            Reply::Ok
        }
        Request::JobPost { .. }
        | Request::JobRound { .. }
        | Request::Heartbeat
        | Request::Nodes { .. }
        | Request::Resolve { .. }
        | Request::ResolveName { .. }
        | Request::Lookup { .. }
        | Request::Regions { .. } => unreachable!("answered above"),
    };
    store.save()?;
    Ok(reply)
}
