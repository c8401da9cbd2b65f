//! What the shared-memory runs predict for more ranks: a model of a run's kernel time from its
//! counts and three costs fitted on the runs themselves.
//!
//! A rank's time at `P` ranks is taken as its share of the one-rank shared run (`T₁ / P`: the
//! application's compute and the protocol's own work, spread evenly; `T₁ / C` where the `P`
//! ranks share `C < P` cores, as the measured runs on this machine's cores do), plus the pages it
//! fetched times a cost per page, plus its synchronisations (barriers and locks) times a cost
//! each, plus the diff bytes it sent times a cost per byte. The cost per page is fitted on the
//! data waits of the runs at the fewest ranks above one (least squares through the origin), the
//! other two on their barrier and lock times; the runs at more ranks then check the model
//! (their predicted time against the measured). The fewest: on a machine of two cores, the
//! 2-rank runs are the ones where every rank has a core of its own, as the nodes predicted for
//! have; at 4 ranks the ranks also wait for a core, which the model does not know of. For more ranks, each count per rank follows a power
//! of `P` through the two largest measured counts of its application, and every rank has a
//! core of its own (as MultiEdge's nodes had).

use serde_json::{json, Value};

/// The costs the model is fitted to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Costs {
    /// Seconds per page fetched.
    pub per_page: f64,
    /// Seconds per synchronisation (a barrier or a lock taken).
    pub per_sync: f64,
    /// Seconds per diff byte sent.
    pub per_diff_byte: f64,
}

/// One shared run's counts per rank, and its times.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    ranks: f64,
    pages: f64,
    syncs: f64,
    diff_bytes: f64,
}

fn f(r: &Value, k: &str) -> f64 {
    r[k].as_f64().unwrap_or(0.0)
}

fn counts(r: &Value) -> Counts {
    let p = f(r, "ranks").max(1.0);
    Counts {
        ranks: p,
        pages: f(r, "fetches") / p,
        syncs: (f(r, "barriers") + f(r, "locks")) / p,
        diff_bytes: f(r, "diff_bytes") / p,
    }
}

/// The costs that fit the shared rows at `ranks` ranks best, if there are any.
pub fn fit(rows: &[Value], ranks: u64) -> Option<Costs> {
    let at: Vec<&Value> =
        rows.iter().filter(|r| r["ranks"].as_u64() == Some(ranks) && r["transport"] != "plain").collect();
    if at.is_empty() {
        return None;
    }
    // Data waits against pages: one parameter through the origin.
    let (xy, xx) = at.iter().fold((0.0, 0.0), |(xy, xx), r| {
        let c = counts(r);
        (xy + c.pages * f(r, "data_wait_s"), xx + c.pages * c.pages)
    });
    let per_page = if xx > 0.0 { xy / xx } else { 0.0 };
    // Barrier and lock times against synchronisations and diff bytes: two parameters, the
    // normal equations solved directly.
    let (mut a11, mut a12, mut a22, mut b1, mut b2) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for r in &at {
        let c = counts(r);
        let y = f(r, "barrier_s") + f(r, "lock_s");
        a11 += c.syncs * c.syncs;
        a12 += c.syncs * c.diff_bytes;
        a22 += c.diff_bytes * c.diff_bytes;
        b1 += c.syncs * y;
        b2 += c.diff_bytes * y;
    }
    let det = a11 * a22 - a12 * a12;
    let (per_sync, per_diff_byte) = if det.abs() > 1e-12 * (a11 * a22).max(1e-300) {
        (((b1 * a22 - b2 * a12) / det).max(0.0), ((a11 * b2 - a12 * b1) / det).max(0.0))
    } else if a11 > 0.0 {
        (b1 / a11, 0.0)
    } else {
        (0.0, 0.0)
    };
    Some(Costs { per_page, per_sync, per_diff_byte })
}

/// The predicted time of a run with counts `n` whose ranks share `cores` cores.
fn time(c: &Costs, one_rank: f64, n: Counts, cores: f64) -> f64 {
    one_rank / n.ranks.min(cores) + c.per_page * n.pages + c.per_sync * n.syncs + c.per_diff_byte * n.diff_bytes
}

/// Each count per rank at `p` ranks, through the power of the rank count that joins the two
/// measured runs `lo` and `hi` (at fewer and more ranks).
fn extrapolate(lo: Counts, hi: Counts, p: f64) -> Counts {
    let grow = |a: f64, b: f64| {
        if a > 0.0 && b > 0.0 {
            b * (p / hi.ranks).powf((b / a).ln() / (hi.ranks / lo.ranks).ln())
        } else {
            b
        }
    };
    Counts {
        ranks: p,
        pages: grow(lo.pages, hi.pages),
        syncs: grow(lo.syncs, hi.syncs),
        diff_bytes: grow(lo.diff_bytes, hi.diff_bytes),
    }
}

/// The model over one run's rows, whose ranks shared `cores` cores: the costs fitted at the
/// fewest ranks above one, each shared row's predicted time beside its measured one, and each
/// application's predicted speedup over its one-process run at `predict` ranks, a core each.
/// `None` with fewer than two rank counts above 1.
pub fn model(rows: &[Value], predict: usize, cores: usize) -> Option<Value> {
    let mut ranks: Vec<u64> = rows.iter().filter_map(|r| r["ranks"].as_u64()).filter(|&r| r > 1).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let (&most, &fewer) = (ranks.last()?, ranks.get(ranks.len().checked_sub(2)?)?);
    let fit_at = ranks[0];
    let costs = fit(rows, fit_at)?;
    let mut checks = Vec::new();
    let mut predictions = Vec::new();
    let apps: Vec<&str> = {
        let mut a: Vec<&str> = rows.iter().filter_map(|r| r["app"].as_str()).collect();
        a.dedup();
        a
    };
    for app in apps {
        let of = |p: u64, plain: bool| {
            rows.iter()
                .find(|r| r["app"] == app && r["ranks"].as_u64() == Some(p) && (r["transport"] == "plain") == plain)
        };
        let (Some(plain), Some(one)) = (of(1, true), of(1, false)) else { continue };
        let one_rank = f(one, "secs");
        for &p in &ranks {
            if let Some(r) = of(p, false) {
                let predicted = time(&costs, one_rank, counts(r), cores as f64);
                checks.push(json!({
                    "app": app, "ranks": p, "measured_s": f(r, "secs"), "predicted_s": predicted,
                    "error": predicted / f(r, "secs") - 1.0, "fitted_on": p == fit_at,
                }));
            }
        }
        if let (Some(lo), Some(hi)) = (of(fewer, false), of(most, false)) {
            let n = extrapolate(counts(lo), counts(hi), predict as f64);
            let t = time(&costs, one_rank, n, predict as f64);
            predictions
                .push(json!({ "app": app, "ranks": predict, "predicted_s": t, "speedup": f(plain, "secs") / t }));
        }
    }
    Some(json!({
        "costs": { "per_page_s": costs.per_page, "per_sync_s": costs.per_sync, "per_diff_byte_s": costs.per_diff_byte },
        "fitted_at_ranks": fit_at, "cores": cores, "checks": checks, "predictions": predictions,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(app: &str, ranks: u64, secs: f64, fetches: f64, syncs: f64, diff: f64, c: &Costs) -> Value {
        let p = ranks as f64;
        json!({
            "app": app, "ranks": ranks, "transport": "edge", "secs": secs,
            "fetches": fetches * p, "barriers": syncs * p, "locks": 0.0, "diff_bytes": diff * p,
            "data_wait_s": c.per_page * fetches,
            "barrier_s": c.per_sync * syncs + c.per_diff_byte * diff, "lock_s": 0.0,
        })
    }

    // Checks the fit and the extrapolation on rows made from known costs: the fitted costs are
    // the ones the rows were made with, every prediction of a made row is exact, and counts
    // that double with the rank count double again at twice the ranks.
    #[test]
    fn known_costs_are_found_again() {
        let c = Costs { per_page: 50e-6, per_sync: 200e-6, per_diff_byte: 8e-9 };
        let mut rows = vec![];
        for (app, one, plain) in [("a", 4.0, 3.0), ("b", 2.0, 1.5)] {
            rows.push(json!({ "app": app, "ranks": 1, "transport": "plain", "secs": plain }));
            rows.push(json!({ "app": app, "ranks": 1, "transport": "none", "secs": one }));
            let (k, s) = if app == "a" { (1000.0, 10.0) } else { (300.0, 40.0) };
            for (p, m) in [(2u64, 1.0), (4, 2.0)] {
                let (pages, syncs, diff) = (k * m, s, 5e5 * m / if app == "a" { 1.0 } else { 3.0 });
                let t = one / p as f64 + c.per_page * pages + c.per_sync * syncs + c.per_diff_byte * diff;
                rows.push(row(app, p, t, pages, syncs, diff, &c));
            }
        }
        let got = fit(&rows, 4).unwrap();
        for (g, w) in [(got.per_page, c.per_page), (got.per_sync, c.per_sync), (got.per_diff_byte, c.per_diff_byte)] {
            assert!((g - w).abs() <= 1e-9 * w.max(1e-12) + 1e-15, "{got:?}");
        }
        let m = model(&rows, 8, 64).unwrap();
        for check in m["checks"].as_array().unwrap() {
            assert!(check["error"].as_f64().unwrap().abs() < 1e-9, "{check}");
        }
        let lo = Counts { ranks: 2.0, pages: 100.0, syncs: 10.0, diff_bytes: 0.0 };
        let hi = Counts { ranks: 4.0, pages: 200.0, syncs: 10.0, diff_bytes: 0.0 };
        let at8 = extrapolate(lo, hi, 8.0);
        assert!((at8.pages - 400.0).abs() < 1e-9 && (at8.syncs - 10.0).abs() < 1e-12, "{at8:?}");
        assert_eq!(m["predictions"].as_array().unwrap().len(), 2);
        assert!(model(&rows[..3], 8, 64).is_none(), "one rank count above 1 is not enough");
        // Ranks sharing fewer cores than they are: the compute share is the cores'.
        let n = Counts { ranks: 4.0, pages: 0.0, syncs: 0.0, diff_bytes: 0.0 };
        assert_eq!(time(&c, 8.0, n, 2.0), 4.0);
    }
}
