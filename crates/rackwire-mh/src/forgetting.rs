//! Forgetting the nodes that left for good (see the `departed` module for when): their records,
//! names, published regions and grants go, saved at once.

use tracing::info;

use crate::shared::{lock, Shared};
use crate::{MhError, NodeId};

/// Forget `ids` (if still down): their records, names, regions and grants; saved once.
fn forget(shared: &Shared, ids: &[NodeId]) -> Result<usize, MhError> {
    let mut store = lock(&shared.store);
    let live = lock(&shared.live);
    let mut departed = lock(&shared.departed);
    let ids: Vec<NodeId> = ids.iter().copied().filter(|id| !live.contains_key(id)).collect();
    drop(live);
    if ids.is_empty() {
        return Ok(0);
    }
    let st = &mut store.state;
    for id in &ids {
        st.nodes.remove(id);
    }
    st.retire(&ids);
    st.regions.retain(|_, r| !ids.contains(&r.node));
    st.grants.retain(|g| !ids.contains(&g.node) && !ids.contains(&g.peer));
    // A save that fails undoes the change: the nodes stay on record, and down.
    store.save()?;
    for id in &ids {
        info!(id, "node forgotten: down longer than its time");
        departed.forgotten(*id);
        lock(&shared.ended).remove(id);
    }
    Ok(ids.len())
}

/// Now and then, forget the nodes down longer than the forget-after time.
pub(crate) fn forget_expired(shared: &Shared) {
    let Some(expired) = lock(&shared.departed).due() else { return };
    if !expired.is_empty() {
        if let Err(e) = forget(shared, &expired) {
            tracing::warn!("could not forget departed nodes: {e}");
        }
    }
}

/// The node table is full: forget the node down longest, if it has been down long enough.
/// Whether room was made.
pub(crate) fn make_room(shared: &Shared) -> bool {
    let Some(id) = lock(&shared.departed).longest_down() else { return false };
    forget(shared, &[id]).is_ok_and(|n| n > 0)
}
