//! Result rows, the table and the JSON document.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use serde::Serialize;

use crate::show_size;

/// One measured row. Peer and limit rows use the same keys with their own `transport`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Row {
    /// `shm`, `memcpy`, `ucx-posix`, ...
    pub transport: String,
    /// `pingpong`, `oneway`, `twoway`, `rate`, `table1`.
    pub pattern: String,
    /// For rows of one pattern measured several ways (Table 1): which way.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Payload bytes per operation.
    pub size: u64,
    /// Operations measured.
    pub iters: u64,
    /// Median one-way latency (ping-pong: half the round trip; streams: time per operation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lat_us_p50: Option<f64>,
    /// 99th percentile of the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lat_us_p99: Option<f64>,
    /// Mean of the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lat_us_avg: Option<f64>,
    /// Payload throughput, 10^6 bytes per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mb_per_s: Option<f64>,
    /// Operations (messages) per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msgs_per_s: Option<f64>,
    /// CPU used by the measuring process, percent of one core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<f64>,
    /// Core-seconds the whole machine was busy per 10^9 payload bytes over the measurement
    /// (see `cpu`): for a path whose two ends share this machine, the whole path's cost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub core_s_per_gb: Option<f64>,
    /// Core-microseconds the whole machine was busy per operation (a ping-pong's round trip)
    /// over the measurement, as [`Row::core_s_per_gb`]: what each costs, spinning included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub core_us_per_op: Option<f64>,
    /// Edge transport: data frames sent again (both directions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retransmits: Option<u64>,
    /// Edge transport: retransmissions as a share of data frames sent, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_pct: Option<f64>,
    /// Edge transport: share of received frames that arrived out of order, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub out_of_order_pct: Option<f64>,
}

/// A benchmark run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// What ran (command line, machine facts).
    pub meta: serde_json::Map<String, serde_json::Value>,
    /// Every row measured.
    pub rows: Vec<Row>,
    /// Things worth knowing (peers not installed, sizes skipped).
    pub notes: Vec<String>,
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// An empty table in the one style every rackwire report and command prints.
pub fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t
}

/// The rows as a table.
pub fn print_table(report: &Report) -> String {
    let mut t = table();
    let net = report.rows.iter().any(|r| r.extra_pct.is_some());
    let cost = report.rows.iter().any(|r| r.core_s_per_gb.is_some() || r.core_us_per_op.is_some());
    let mut header = vec![
        "transport",
        "pattern",
        "size",
        "iters",
        "lat p50 µs",
        "lat p99 µs",
        "lat avg µs",
        "MB/s",
        "msgs/s",
        "cpu %",
    ];
    if cost {
        header.extend(["core-s/GB", "core-µs/op"]);
    }
    if net {
        header.extend(["retx", "extra %", "ooo %"]);
    }
    t.set_header(header);
    for r in &report.rows {
        let pattern = match &r.variant {
            Some(v) => format!("{} ({v})", r.pattern),
            None => r.pattern.clone(),
        };
        let cells = [
            Cell::new(&r.transport),
            Cell::new(pattern),
            Cell::new(show_size(r.size)).set_alignment(CellAlignment::Right),
            Cell::new(r.iters).set_alignment(CellAlignment::Right),
            Cell::new(f(r.lat_us_p50, 3)).set_alignment(CellAlignment::Right),
            Cell::new(f(r.lat_us_p99, 3)).set_alignment(CellAlignment::Right),
            Cell::new(f(r.lat_us_avg, 3)).set_alignment(CellAlignment::Right),
            Cell::new(f(r.mb_per_s, 1)).set_alignment(CellAlignment::Right),
            Cell::new(f(r.msgs_per_s, 0)).set_alignment(CellAlignment::Right),
            Cell::new(f(r.cpu_pct, 0)).set_alignment(CellAlignment::Right),
        ];
        let mut cells = cells.to_vec();
        if cost {
            cells.push(Cell::new(f(r.core_s_per_gb, 3)).set_alignment(CellAlignment::Right));
            cells.push(Cell::new(f(r.core_us_per_op, 1)).set_alignment(CellAlignment::Right));
        }
        if net {
            cells.push(
                Cell::new(r.retransmits.map_or("-".into(), |v| v.to_string())).set_alignment(CellAlignment::Right),
            );
            cells.push(Cell::new(f(r.extra_pct, 2)).set_alignment(CellAlignment::Right));
            cells.push(Cell::new(f(r.out_of_order_pct, 2)).set_alignment(CellAlignment::Right));
        }
        t.add_row(cells);
    }
    let mut out = t.to_string();
    for n in &report.notes {
        out.push_str("\nnote: ");
        out.push_str(n);
    }
    out
}

/// The rows as a Markdown table.
pub fn markdown(report: &Report) -> String {
    let mut out = String::from(
        "| transport | pattern | size | iters | lat p50 µs | lat p99 µs | lat avg µs | MB/s | msgs/s | cpu % |\n",
    );
    out.push_str("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for r in &report.rows {
        let pattern = match &r.variant {
            Some(v) => format!("{} ({v})", r.pattern),
            None => r.pattern.clone(),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.transport,
            pattern,
            show_size(r.size),
            r.iters,
            f(r.lat_us_p50, 3),
            f(r.lat_us_p99, 3),
            f(r.lat_us_avg, 3),
            f(r.mb_per_s, 1),
            f(r.msgs_per_s, 0),
            f(r.cpu_pct, 0)
        ));
    }
    for n in &report.notes {
        out.push_str(&format!("\n_note: {n}_\n"));
    }
    out
}

impl Report {
    /// Append another run's rows and notes.
    pub fn merge(&mut self, other: Report) {
        self.rows.extend(other.rows);
        self.notes.extend(other.notes);
    }

    /// The first row matching transport, pattern and size.
    pub fn find(&self, transport: &str, pattern: &str, size: u64) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.transport == transport && r.pattern == pattern && r.size == size && r.variant.is_none())
    }
}
