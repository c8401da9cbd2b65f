//! The management host's state as records, the way it is kept in etcd: one record per node,
//! per published name and per grant, and one (`meta`) of what is left, each a small JSON
//! document under [`RECORDS_PREFIX`]. A change is kept by writing the records it changed
//! ([`diff`]), so what one write carries does not grow with the state (etcd refuses a request
//! past 1.5 MiB by default, about 13,000 grants as one document).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::State;
use crate::proto::{GrantEntry, NodeInfo, RegionEntry};
use crate::{MhError, NodeId};

/// Where the records live, under the fabric's etcd prefix.
pub(crate) const RECORDS_PREFIX: &str = "state/";
const META: &str = "state/meta";

/// Records by name (relative to the fabric's prefix), each a JSON document.
pub(crate) type Records = BTreeMap<String, Vec<u8>>;

/// What is left of the state once nodes, names and grants are records of their own.
#[derive(Serialize, Deserialize)]
struct Meta {
    next_id: NodeId,
    #[serde(default)]
    retired: BTreeSet<NodeId>,
}

fn node_key(id: NodeId) -> String {
    format!("{RECORDS_PREFIX}node/{id:010}")
}

fn region_key(name: &str) -> String {
    format!("{RECORDS_PREFIX}region/{name}")
}

fn grant_key(g: &GrantEntry) -> String {
    format!("{RECORDS_PREFIX}grant/{:010}/{:010}/{:010}", g.node, g.region, g.peer)
}

fn json<T: Serialize>(v: &T) -> Result<Vec<u8>, MhError> {
    serde_json::to_vec(v).map_err(|e| MhError::Protocol(e.to_string()))
}

/// The records of `state`.
pub(crate) fn of(state: &State) -> Result<Records, MhError> {
    let mut r = Records::new();
    r.insert(META.into(), json(&Meta { next_id: state.next_id, retired: state.retired.clone() })?);
    for (id, n) in &state.nodes {
        r.insert(node_key(*id), json(n)?);
    }
    for (name, e) in &state.regions {
        r.insert(region_key(name), json(e)?);
    }
    for g in &state.grants {
        r.insert(grant_key(g), json(g)?);
    }
    Ok(r)
}

/// The state the records `recs` hold; `None` when they hold none (no `meta` record).
pub(crate) fn to_state(recs: &[(String, Vec<u8>)]) -> Result<Option<State>, MhError> {
    let damaged = |name: &str, e: serde_json::Error| MhError::Config(format!("record {name} in etcd is damaged: {e}"));
    let mut state = State::default();
    let mut meta = None;
    let (nodes, regions, grants) =
        (format!("{RECORDS_PREFIX}node/"), format!("{RECORDS_PREFIX}region/"), format!("{RECORDS_PREFIX}grant/"));
    for (name, bytes) in recs {
        if name == META {
            meta = Some(serde_json::from_slice::<Meta>(bytes).map_err(|e| damaged(name, e))?);
        } else if name.starts_with(&nodes) {
            let n: NodeInfo = serde_json::from_slice(bytes).map_err(|e| damaged(name, e))?;
            state.nodes.insert(n.id, n);
        } else if name.starts_with(&regions) {
            let e: RegionEntry = serde_json::from_slice(bytes).map_err(|e| damaged(name, e))?;
            state.regions.insert(e.name.clone(), e);
        } else if name.starts_with(&grants) {
            state.grants.push(serde_json::from_slice(bytes).map_err(|e| damaged(name, e))?);
        }
    }
    Ok(meta.map(|m| State { next_id: m.next_id, retired: m.retired, ..state }))
}

/// What turns the records `old` into `new`: records to write, and names to delete.
pub(crate) fn diff(old: &Records, new: &Records) -> (Vec<(String, Vec<u8>)>, Vec<String>) {
    let puts = new.iter().filter(|(k, v)| old.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
    let deletes = old.keys().filter(|k| !new.contains_key(*k)).cloned().collect();
    (puts, deletes)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the records round trip and the diff: a state with nodes, names (one with a slash)
    // and grants becomes records and back unchanged (grants in record order); a change of one
    // grant's access and a removed name diff to one write and one delete, and applying the diff
    // to the old records gives the new ones.
    #[test]
    fn records_round_trip_and_diff_to_what_changed() {
        let mut s = State { next_id: 42, ..State::default() };
        s.retired.insert(7);
        s.nodes.insert(5, NodeInfo { id: 5, name: "n5".into(), ..NodeInfo::default() });
        for name in ["r1", "vnic/n5"] {
            let key = "00".repeat(16);
            s.regions.insert(name.into(), RegionEntry { name: name.into(), node: 5, region: 1, key, len: 64 });
        }
        s.grants.push(GrantEntry { node: 5, region: 1, peer: 9, access: 3 });
        s.grants.push(GrantEntry { node: 5, region: 1, peer: 8, access: 1 });
        let recs = of(&s).unwrap();
        let back = to_state(&recs.clone().into_iter().collect::<Vec<_>>()).unwrap().unwrap();
        assert_eq!((back.next_id, back.retired.clone(), back.nodes.clone()), (42, s.retired.clone(), s.nodes.clone()));
        assert_eq!(back.regions, s.regions);
        let mut grants = s.grants.clone();
        grants.sort_by_key(|g| (g.node, g.region, g.peer));
        assert_eq!(back.grants, grants);
        let mut t = s.clone();
        t.grants[0].access = 1;
        t.regions.remove("r1");
        let new = of(&t).unwrap();
        let (puts, deletes) = diff(&recs, &new);
        assert_eq!(puts.len(), 1, "{puts:?}");
        assert_eq!(deletes, vec![region_key("r1")]);
        let mut applied = recs.clone();
        applied.extend(puts);
        for d in deletes {
            applied.remove(&d);
        }
        assert_eq!(applied, new);
        assert_eq!(to_state(&[]).unwrap().map(|s| s.next_id), None, "no meta: no state");
    }
}
