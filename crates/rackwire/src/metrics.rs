//! What a node tells a scraper (Prometheus text format; see `rackwire_metrics`): its
//! connections per peer and per link, the owner's audit of refused accesses, its regions.

use std::collections::BTreeMap;

use rackwire_metrics::{Kind, Text};

use crate::node::Node;

/// Connection counters that are gauges (the rest only grow).
const CONN_GAUGES: &[&str] = &["frame_max", "path_frame_max", "sealed"];

/// The node's page.
pub(crate) fn render(node: &Node) -> String {
    let mut t = Text::new();
    let me = node.id.to_string();
    t.family("rackwire_node_info", Kind::Gauge, "This node: its id and name (always 1).");
    t.sample("rackwire_node_info", &[("node", &me), ("name", &node.cfg.name)], 1.0);
    t.single("rackwire_regions", Kind::Gauge, "Regions this node owns.", node.regions.len() as f64);
    let peers = node.all_peers();
    t.single("rackwire_connections", Kind::Gauge, "Live connections to peers.", peers.len() as f64);
    t.single(
        "rackwire_key_lookups_skipped_total",
        Kind::Counter,
        "First frames from node ids whose key is not known here that started no lookup at the \
         management host (an id it said lately it does not know, or past the lookups' rate).",
        node.key_lookups_skipped.load(std::sync::atomic::Ordering::Relaxed) as f64,
    );

    // Per peer and transport (two connections to one peer over one transport add up).
    let mut conns: BTreeMap<(u32, &'static str), BTreeMap<String, f64>> = BTreeMap::new();
    for p in peers.iter() {
        let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(p.stats()) else { continue };
        let row = conns.entry((p.peer(), p.kind())).or_default();
        for (k, v) in fields {
            let v = v.as_f64().or_else(|| v.as_bool().map(|b| b as u8 as f64)).unwrap_or(0.0);
            let slot = row.entry(k.clone()).or_insert(0.0);
            *slot = if CONN_GAUGES.contains(&k.as_str()) { slot.max(v) } else { *slot + v };
        }
    }
    // Every transport's counters, and each transport's own (a family holds the peers whose
    // transport counts it).
    let fields: std::collections::BTreeSet<String> = conns.values().flat_map(|r| r.keys().cloned()).collect();
    for f in &fields {
        let gauge = CONN_GAUGES.contains(&f.as_str());
        let name = if gauge { format!("rackwire_peer_{f}") } else { format!("rackwire_peer_{f}_total") };
        let help = format!("Per peer and transport: {}.", f.replace('_', " "));
        t.family(&name, if gauge { Kind::Gauge } else { Kind::Counter }, &help);
        for ((peer, kind), row) in &conns {
            if let Some(v) = row.get(f) {
                t.sample(&name, &[("peer", &peer.to_string()), ("transport", kind)], *v);
            }
        }
    }

    // Per link of each edge connection.
    let links: Vec<(u32, usize, rackwire_proto::LinkStats)> =
        peers.iter().flat_map(|p| p.link_stats().into_iter().enumerate().map(move |(l, s)| (p.peer(), l, s))).collect();
    type Field = fn(&rackwire_proto::LinkStats) -> u64;
    let link_fields: [(&str, Kind, &str, Field); 13] = [
        ("frames_sent_total", Kind::Counter, "frames sent", |s| s.frames_sent),
        ("bytes_sent_total", Kind::Counter, "bytes sent", |s| s.bytes_sent),
        ("frames_received_total", Kind::Counter, "valid frames received", |s| s.frames_received),
        ("bytes_received_total", Kind::Counter, "bytes received", |s| s.bytes_received),
        ("retransmits_total", Kind::Counter, "data frames sent again", |s| s.retransmits),
        ("losses_total", Kind::Counter, "frames declared lost", |s| s.losses),
        ("loss_timeouts_total", Kind::Counter, "losses found by the retransmission timer", |s| s.timeouts),
        ("window_cuts_total", Kind::Counter, "window cuts", |s| s.cuts),
        ("probes_total", Kind::Counter, "probes sent", |s| s.probes),
        ("downs_total", Kind::Counter, "times the link went down", |s| s.downs),
        ("rtt_seconds", Kind::Gauge, "smoothed round-trip time", |s| s.srtt_us),
        (
            "min_rtt_seconds",
            Kind::Gauge,
            "quickest round trip measured (a lone frame takes the link where it is least)",
            |s| s.min_rtt_us,
        ),
        ("window_frames", Kind::Gauge, "current window, frames", |s| s.window),
    ];
    for (suffix, kind, help, get) in link_fields {
        let name = format!("rackwire_link_{suffix}");
        // The round trip is kept in microseconds; Prometheus's base unit is the second.
        // (Divided, not multiplied by 1e-6: 19 µs prints as 0.000019.)
        let per = if suffix.ends_with("rtt_seconds") { 1e6 } else { 1.0 };
        t.family(&name, kind, &format!("Per edge link of a peer connection: {help}."));
        for (peer, l, s) in &links {
            t.sample(&name, &[("peer", &peer.to_string()), ("link", &l.to_string())], get(s) as f64 / per);
        }
    }

    t.family(
        "rackwire_refused_total",
        Kind::Counter,
        "The owner's audit: accesses to this node's regions refused, by region, peer and reason.",
    );
    for ((region, peer, why), n) in node.regions.audit() {
        t.sample(
            "rackwire_refused_total",
            &[("region", &region.to_string()), ("peer", &peer.to_string()), ("reason", why)],
            n as f64,
        );
    }
    t.finish()
}
