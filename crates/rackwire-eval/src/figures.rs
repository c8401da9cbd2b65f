//! The report's pictures from measured rows: the micro-benchmarks against size (OSU Figs.
//! 2–3), collective latency against size (Figs. 4–5), the sort's phases (HP Fig. 2) and
//! grep's four variants (Fig. 3). Each function writes its SVG files into the report folder
//! and returns the markdown that shows them.

use std::collections::BTreeMap;
use std::path::Path;

use crate::plot::{self, Bar, Series};
use anyhow::Result;
use rackwire_bench::Report;

/// Lines of one picture by name, each its points.
type Lines = BTreeMap<String, Vec<(f64, f64)>>;

/// Series at most per picture (plot's limit).
const SERIES_MAX: usize = plot::SERIES_MAX;

fn image(file: &str, caption: &str) -> String {
    format!("![{caption}]({file})\n\n")
}

/// Latency and bandwidth against size, one line per transport or peer.
pub fn micro(report: &Report, dir: &Path) -> Result<String> {
    let mut md = String::new();
    let by = |pattern: &str, value: fn(&rackwire_bench::Row) -> Option<f64>| {
        let mut lines: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
        for r in report.rows.iter().filter(|r| r.pattern == pattern && r.variant.is_none()) {
            if let Some(v) = value(r) {
                lines.entry(&r.transport).or_default().push((r.size as f64, v));
            }
        }
        lines
            .into_iter()
            .take(SERIES_MAX)
            .map(|(name, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { name: name.to_string(), points }
            })
            .collect::<Vec<_>>()
    };
    let lat = by("pingpong", |r| r.lat_us_p50);
    if !lat.is_empty() {
        plot::lines(&dir.join("latency.svg"), "Ping-pong latency (p50, one way)", "message size", "µs", true, &lat)?;
        md.push_str(&image("latency.svg", "ping-pong latency against size"));
    }
    let bw = by("oneway", |r| r.mb_per_s);
    if !bw.is_empty() {
        plot::lines(&dir.join("bandwidth.svg"), "One-way bandwidth", "message size", "MB/s", false, &bw)?;
        md.push_str(&image("bandwidth.svg", "one-way bandwidth against size"));
    }
    Ok(md)
}

/// Collective latency against size: one picture per collective and rank count, one line per
/// transport (and destination).
pub fn collectives(rows: &[serde_json::Value], dir: &Path) -> Result<String> {
    let mut md = String::new();
    let mut pics: BTreeMap<(String, u64), Lines> = BTreeMap::new();
    for r in rows {
        let (Some(op), Some(ranks), Some(t), Some(size), Some(lat)) = (
            r["pattern"].as_str(),
            r["ranks"].as_u64(),
            r["transport"].as_str(),
            r["size"].as_u64(),
            r["lat_us_avg"].as_f64(),
        ) else {
            continue;
        };
        if op == "barrier" {
            continue;
        }
        let name = match r["dest"].as_str() {
            Some("registered") => format!("{t} (registered)"),
            _ => t.to_string(),
        };
        pics.entry((op.to_string(), ranks)).or_default().entry(name).or_default().push((size as f64, lat));
    }
    for ((op, ranks), lines) in pics {
        let series: Vec<Series> = lines
            .into_iter()
            .take(SERIES_MAX)
            .map(|(name, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { name, points }
            })
            .collect();
        let file = format!("coll-{op}-{ranks}.svg");
        plot::lines(
            &dir.join(&file),
            &format!("{op}, {ranks} ranks (average latency)"),
            "message size",
            "µs",
            true,
            &series,
        )?;
        md.push_str(&image(&file, &format!("{op} latency at {ranks} ranks")));
    }
    Ok(md)
}

/// Each workload run's phases as stacked bars, one bar per workload and path.
pub fn workloads(rows: &[serde_json::Value], dir: &Path) -> Result<String> {
    let mut md = String::new();
    let bar = |r: &serde_json::Value, label: String| Bar {
        label,
        parts: crate::runs::phases_in_order(r).into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
    };
    let label = |r: &serde_json::Value| {
        let cores = r["cores"].as_u64().map(|c| format!(" {c}c")).unwrap_or_default();
        format!("{}{cores}", r["net"].as_str().unwrap_or(""))
    };
    let sort: Vec<Bar> = rows.iter().filter(|r| r["pattern"] == "sort").map(|r| bar(r, label(r))).collect();
    if !sort.is_empty() {
        plot::stacked_bars(&dir.join("sort-phases.svg"), "Distributed sort: time by phase", "seconds", &sort)?;
        md.push_str(&image("sort-phases.svg", "the sort's time by phase over the fabric and over TCP"));
    }
    let grep: Vec<Bar> = rows
        .iter()
        .filter_map(|r| {
            let v = r["pattern"].as_str()?.strip_prefix("grep/")?;
            Some(bar(r, format!("{v} {}", label(r))))
        })
        .take(plot::BARS_MAX)
        .collect();
    if !grep.is_empty() {
        plot::stacked_bars(&dir.join("grep-phases.svg"), "Distributed grep: scan and reduce", "seconds", &grep)?;
        md.push_str(&image("grep-phases.svg", "grep's four variants over the fabric and over TCP"));
    }
    // One figure of each run, by path: TestDFSIO's throughput, YCSB's operations per second.
    let figure = |prefix: &str, key: &str| -> Vec<Bar> {
        rows.iter()
            .filter(|r| r["pattern"].as_str().is_some_and(|p| p == prefix || p.starts_with(&format!("{prefix}/"))))
            .filter_map(|r| {
                let v = r[key].as_f64()?;
                Some(Bar {
                    label: format!("{} {}", r["pattern"].as_str()?, label(r)),
                    parts: vec![(key.to_string(), v)],
                })
            })
            .take(plot::BARS_MAX)
            .collect()
    };
    let dfsio = figure("dfsio", "throughput_mb_per_s");
    if !dfsio.is_empty() {
        plot::stacked_bars(&dir.join("dfsio.svg"), "Replicated block writes: TestDFSIO throughput", "MB/s", &dfsio)?;
        md.push_str(&image("dfsio.svg", "TestDFSIO throughput over the fabric and over TCP"));
    }
    let kv = figure("kv", "ops_per_s");
    if !kv.is_empty() {
        plot::stacked_bars(&dir.join("kv.svg"), "Key-value mixes: operations per second", "ops/s", &kv)?;
        md.push_str(&image(
            "kv.svg",
            "YCSB mixes and 100% puts over the fabric (one-sided reads), the fabric as requests, and TCP",
        ));
    }
    Ok(md)
}
