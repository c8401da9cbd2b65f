//! Repeated comparisons: the same suite run several times on a noisy machine, each row given
//! as its median run, and each of our rows' ratio to every peer or limit row of the same
//! pattern and size, per run, as a median with its spread.
//!
//! Every run measures ours and the peers one after the other, so the ratio of one run compares
//! figures taken moments apart; the spread of those ratios over the runs says how far a
//! single run can be trusted.

use crate::{Report, Row};

/// Rows of these transports are ours; every other row is a peer or a limit.
pub const OURS: &[&str] = &["shm", "shm-pinned", "udp", "udp-unsealed"];

/// A row's figure for comparing: the median one-way latency (or the mean where only that is
/// known) for ping-pong, lower is better; the payload rate otherwise, higher is better.
fn figure(r: &Row) -> Option<f64> {
    if r.pattern == "pingpong" {
        r.lat_us_p50.or(r.lat_us_avg)
    } else {
        r.mb_per_s
    }
}

/// Whether `theirs` is compared with `ours`: same pattern and size; the cache-line ping-pong
/// (measured at 8 bytes) is the limit of every 8-byte ping-pong.
fn comparable(ours: &Row, theirs: &Row) -> bool {
    !OURS.contains(&theirs.transport.as_str())
        && theirs.pattern == ours.pattern
        && theirs.size == ours.size
        && theirs.variant.is_none()
        && ours.variant.is_none()
}

/// One comparison over the runs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RatioSummary {
    /// Our row's transport, and the peer's.
    pub ours: String,
    /// The peer's or limit's transport.
    pub theirs: String,
    /// Pattern and size.
    pub pattern: String,
    /// Bytes.
    pub size: u64,
    /// `lat_us_p50` (ours over theirs: below 1 is faster) or `mb_per_s` (above 1 is faster).
    pub figure: &'static str,
    /// Median, smallest and largest ratio over the runs.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Each run's ratio, in run order.
    pub runs: Vec<f64>,
}

/// The median, smallest and largest of `v` (sorted in place; `v` not empty).
pub fn median_spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Each comparison of our rows with the peer rows, over `runs`.
pub fn ratios(runs: &[Report]) -> Vec<RatioSummary> {
    let mut out: Vec<RatioSummary> = Vec::new();
    for run in runs {
        for ours in run.rows.iter().filter(|r| OURS.contains(&r.transport.as_str())) {
            for theirs in run.rows.iter().filter(|t| comparable(ours, t)) {
                let (Some(a), Some(b)) = (figure(ours), figure(theirs)) else { continue };
                if b <= 0.0 {
                    continue;
                }
                let found = out.iter_mut().find(|s| {
                    s.ours == ours.transport
                        && s.theirs == theirs.transport
                        && s.pattern == ours.pattern
                        && s.size == ours.size
                });
                match found {
                    Some(s) => s.runs.push(a / b),
                    None => out.push(RatioSummary {
                        ours: ours.transport.clone(),
                        theirs: theirs.transport.clone(),
                        pattern: ours.pattern.clone(),
                        size: ours.size,
                        figure: if ours.pattern == "pingpong" { "lat_us_p50" } else { "mb_per_s" },
                        median: 0.0,
                        min: 0.0,
                        max: 0.0,
                        runs: vec![a / b],
                    }),
                }
            }
        }
    }
    for s in &mut out {
        let mut v = s.runs.clone();
        (s.median, s.min, s.max) = median_spread(&mut v);
    }
    out
}

/// One report of `runs`: every row as its median run (by its figure), the notes of every run
/// (once each), and the comparisons as notes and as `meta.ratios`.
pub fn combine(runs: Vec<Report>) -> Report {
    let summaries = ratios(&runs);
    let mut report = Report::default();
    if let Some(first) = runs.first() {
        report.meta = first.meta.clone();
    }
    let key = |r: &Row| (r.transport.clone(), r.pattern.clone(), r.size, r.variant.clone());
    let mut keys: Vec<_> = Vec::new();
    for r in runs.iter().flat_map(|run| &run.rows) {
        if !keys.contains(&key(r)) {
            keys.push(key(r));
        }
    }
    for k in keys {
        let mut same: Vec<&Row> = runs.iter().flat_map(|run| &run.rows).filter(|r| key(r) == k).collect();
        same.sort_by(|a, b| figure(a).unwrap_or(0.0).total_cmp(&figure(b).unwrap_or(0.0)));
        report.rows.push(same[same.len() / 2].clone());
    }
    for n in runs.iter().flat_map(|run| &run.notes) {
        if !report.notes.contains(n) {
            report.notes.push(n.clone());
        }
    }
    for s in &summaries {
        let better = if s.figure == "lat_us_p50" { "latency" } else { "rate" };
        report.notes.push(format!(
            "{} / {} {} {} {better}: {:.2} (median of {}; {:.2}-{:.2})",
            s.ours,
            s.theirs,
            s.pattern,
            crate::show_size(s.size),
            s.median,
            s.runs.len(),
            s.min,
            s.max
        ));
    }
    report.meta.insert("repeats".into(), runs.len().into());
    report.meta.insert("ratios".into(), serde_json::to_value(&summaries).unwrap_or_default());
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(t: &str, p: &str, size: u64, lat: Option<f64>, mb: Option<f64>) -> Row {
        Row { transport: t.into(), pattern: p.into(), size, lat_us_p50: lat, mb_per_s: mb, ..Row::default() }
    }

    // Checks the combination of three runs: each row is its median run; our ping-pong is
    // compared with the peer's latency and our one-way stream with the peer's and the limit's
    // rate, run by run (ratios 0.5/1.0/2.0 → median 1.0, spread 0.5-2.0); rows of other
    // sizes or of our own other transport are never compared.
    #[test]
    fn runs_combine_into_median_rows_and_ratio_spreads() {
        let run = |ours_lat: f64, peer_lat: f64, ours_mb: f64| Report {
            rows: vec![
                row("shm", "pingpong", 8, Some(ours_lat), None),
                row("ucx-posix", "pingpong", 8, Some(peer_lat), None),
                row("shm-pinned", "pingpong", 8, Some(ours_lat / 2.0), None),
                row("shm", "oneway", 8, None, Some(ours_mb)),
                row("ucx-posix", "oneway", 8, None, Some(100.0)),
                row("ucx-posix", "oneway", 64, None, Some(1.0)),
            ],
            ..Report::default()
        };
        let runs = vec![run(1.0, 2.0, 50.0), run(2.0, 2.0, 100.0), run(4.0, 2.0, 200.0)];
        let r = combine(runs);
        let shm_pp = r.find("shm", "pingpong", 8).unwrap();
        assert_eq!(shm_pp.lat_us_p50, Some(2.0), "the median run's row");
        let s = ratios(std::slice::from_ref(&r));
        assert!(s.iter().all(|s| s.runs.len() == 1));
        let meta = r.meta["ratios"].as_array().unwrap();
        let pp = meta.iter().find(|m| m["ours"] == "shm" && m["pattern"] == "pingpong").unwrap();
        assert_eq!((pp["median"].as_f64(), pp["min"].as_f64(), pp["max"].as_f64()), (Some(1.0), Some(0.5), Some(2.0)));
        let ow = meta.iter().find(|m| m["ours"] == "shm" && m["pattern"] == "oneway").unwrap();
        assert_eq!(ow["runs"], serde_json::json!([0.5, 1.0, 2.0]));
        assert_eq!(ow["theirs"], "ucx-posix");
        assert!(!meta.iter().any(|m| m["theirs"] == "shm-pinned" || m["size"] == 64));
        assert_eq!(r.meta["repeats"], 3);
        assert!(r
            .notes
            .iter()
            .any(|n| n.starts_with("shm / ucx-posix pingpong 8 latency: 1.00 (median of 3; 0.50-2.00)")));
    }
}
