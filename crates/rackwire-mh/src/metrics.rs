//! What the management host tells a scraper (Prometheus text format; see `rackwire_metrics`).

use rackwire_metrics::{Kind, Text};

use crate::shared::Shared;

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The management host's page: nodes by state, names, grants, sessions, jobs, admissions.
pub(crate) fn render(s: &Shared) -> String {
    let (nodes, up, regions, grants) = {
        let st = s.view.read().unwrap_or_else(|e| e.into_inner()).clone();
        let live = lock(&s.live);
        let up = st.nodes.keys().filter(|id| live.contains_key(id)).count();
        (st.nodes.len(), up, st.regions.len(), st.grants.len())
    };
    let mut t = Text::new();
    t.family("rackwire_mh_nodes", Kind::Gauge, "Nodes on record, by state (up: a live session with heartbeats).");
    t.sample("rackwire_mh_nodes", &[("state", "up")], up as f64);
    t.sample("rackwire_mh_nodes", &[("state", "down")], (nodes - up) as f64);
    t.single("rackwire_mh_region_names", Kind::Gauge, "Published region names.", regions as f64);
    t.single("rackwire_mh_grants", Kind::Gauge, "Grant records.", grants as f64);
    t.single(
        "rackwire_mh_sessions",
        Kind::Gauge,
        "Open sessions (nodes and observers).",
        lock(&s.sessions).len() as f64,
    );
    t.single(
        "rackwire_mh_sessions_waiting",
        Kind::Gauge,
        "Connections not admitted yet (bounded; the oldest is shut for a new one).",
        lock(&s.sessions).waiting() as f64,
    );
    t.single("rackwire_mh_jobs", Kind::Gauge, "Jobs with a bootstrap under way or done.", lock(&s.jobs).len() as f64);
    t.family(
        "rackwire_mh_admissions_total",
        Kind::Counter,
        "Admissions by outcome (refused: wrong secret, key, name; turned: closed before any work, its \
         source past its wrong secrets a minute).",
    );
    let adm = lock(&s.admissions).clone();
    for outcome in ["admitted", "refused", "turned"] {
        t.sample(
            "rackwire_mh_admissions_total",
            &[("outcome", outcome)],
            adm.get(outcome).copied().unwrap_or(0) as f64,
        );
    }
    t.finish()
}
