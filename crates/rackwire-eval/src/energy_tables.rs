//! `rackwire eval energy`: HP's efficiency tables (Tables 2 and 3) from runs measured now, and
//! Marlin's Table 3 from the power table. Every energy figure is an estimate from the model
//! (`crate::energy`), never a measurement.

use crate::energy::{self, improvement, Config, Estimate, PowerTable};
use crate::grep::Variant;
use crate::Net;
use anyhow::Result;
use serde_json::json;

use crate::runs::EvalArgs;

/// The model's assumptions, printed under the tables.
const MODEL_NOTE: &str = "Energy figures are estimates from a model, not measurements: each rank is a node with the \
given cores, DRAM, RAMFS storage and a NIC plus switch port of its network; a core draws 9 W at \
peak and half of that idle (HP section 2; Barroso and Hoelzle 2007), linearly in between by the busy \
core-seconds of the whole machine over the run; DRAM 6 W; 1GbE 3.9 W, 10GbE 17.3 W, PCIe 1 W per node (HP Table 1). The \
fabric within a memory domain stands for PCIe; TCP for the Ethernet of the rack's rail \
(unshaped: 10GbE). Improvement = records per joule over the baseline's, minus one.";

/// Core counts to measure: HP's 1, 2 and 4, as far as this machine has cores.
fn core_counts() -> Vec<usize> {
    let have = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    [1, 2, 4].into_iter().filter(|&k| k <= have).collect()
}

/// One measured configuration: workload (and variant), cores, path → its median run.
struct Cell {
    pattern: String,
    cores: usize,
    net: Net,
    network: &'static str,
    est: Estimate,
    secs: f64,
}

fn measure_cells(a: &EvalArgs, table: &PowerTable, gbit: Option<f64>) -> Result<Vec<Cell>> {
    let mut cells = Vec::new();
    let mut jobs: Vec<(&str, Option<Variant>)> = vec![("sort", None)];
    jobs.extend(Variant::ALL.iter().map(|&v| ("grep", Some(v))));
    for (workload, variant) in jobs {
        for cores in core_counts() {
            let mut args = a.clone();
            args.workload = workload.into();
            args.net = vec!["fabric".into(), "tcp".into()];
            args.variant = variant.map(|v| vec![v.name().to_string()]).unwrap_or_default();
            args.cores = Some(cores);
            let m = crate::runs::measure_set(&args, workload, variant.map(Variant::name))?;
            for (net, runs) in &m.runs {
                let run = crate::runs::median_run(runs);
                let network = energy::network_kind(&run.transport, gbit);
                let cfg = Config { network: network.into(), storage: "RAMFS".into(), cores: cores as u32 };
                cells.push(Cell {
                    pattern: m.pattern.clone(),
                    cores,
                    net: *net,
                    network,
                    est: table.estimate_run(&cfg, run)?,
                    secs: run.secs,
                });
            }
        }
    }
    Ok(cells)
}

fn pct(x: f64) -> String {
    format!("{:+.0}%", x * 100.0)
}

/// `rackwire eval energy`: measure, price and print the energy tables.
pub fn run(a: &EvalArgs) -> Result<()> {
    let (doc, text) = tables(a)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{text}");
    }
    Ok(())
}

/// Measure and price every configuration: the JSON document and the tables as text.
pub fn tables(a: &EvalArgs) -> Result<(serde_json::Value, String)> {
    crate::runs::check(a)?;
    let table = crate::runs::load_table(a)?;
    let gbit = crate::runs::rail_gbit(a.rack.as_deref())?;
    let cells = measure_cells(a, &table, gbit)?;
    let find = |pattern: &str, cores: usize, net: Net| {
        cells.iter().find(|c| c.pattern == pattern && c.cores == cores && c.net == net)
    };
    let eth = energy::network_kind("tcp", gbit);
    let cores = core_counts();
    // HP Table 2: the sort, against the Ethernet path with one core.
    let mut sort_rows = Vec::new();
    let base = find("sort", 1, Net::Tcp).map(|c| c.est);
    for &k in &cores {
        let cell = |net| find("sort", k, net).zip(base).map(|(c, b)| improvement(&c.est, &b));
        sort_rows.push(json!({ "cores": k, eth: cell(Net::Tcp), "PCIe": cell(Net::Fabric) }));
    }
    // HP Table 3: grep's four variants, each against its own Ethernet, one-core run.
    let mut grep_rows = Vec::new();
    for v in Variant::ALL {
        let p = format!("grep/{}", v.name());
        let base = find(&p, 1, Net::Tcp).map(|c| c.est);
        let mut row = serde_json::Map::new();
        row.insert("variant".into(), json!(v.name()));
        for net in [Net::Tcp, Net::Fabric] {
            for &k in &cores {
                let name = if net == Net::Tcp { eth } else { "PCIe" };
                let x = find(&p, k, net).zip(base).map(|(c, b)| improvement(&c.est, &b));
                row.insert(format!("{name} {k}-core"), json!(x));
            }
        }
        grep_rows.push(serde_json::Value::Object(row));
    }
    let marlin: Vec<serde_json::Value> = table
        .rack
        .iter()
        .map(|r| {
            json!({ "interconnect": r.name, "total_gbit": r.total_gbit(), "switch_watts": r.switch_watts,
                    "adapter_watts": r.adapter_watts * f64::from(r.adapters) + r.other_watts,
                    "total_watts": r.total_watts(), "watts_per_gbit": r.watts_per_gbit(), "source": r.source })
        })
        .collect();
    let runs: Vec<serde_json::Value> = cells
        .iter()
        .map(|c| {
            json!({ "pattern": c.pattern, "cores": c.cores, "net": c.net.name(), "network_model": c.network,
                    "secs": c.secs, "joules_est": c.est.joules, "work_per_joule_est": c.est.work_per_joule })
        })
        .collect();
    let doc = json!({
        "meta": { "command": std::env::args().collect::<Vec<_>>().join(" "), "model": MODEL_NOTE },
        "sort_efficiency": sort_rows, "grep_efficiency": grep_rows, "marlin_table_3": marlin, "rows": runs,
    });
    let mut text = String::new();
    let mut t2 = rackwire_bench::table();
    t2.set_header(["sort (RAMFS)", &format!("{eth} (TCP)"), "PCIe (fabric)"]);
    for r in &sort_rows {
        let cell = |k: &str| r[k].as_f64().map(pct).unwrap_or_default();
        t2.add_row([format!("{}-core", r["cores"]), cell(eth), cell("PCIe")]);
    }
    text.push_str(&format!(
        "Sort energy efficiency improvement over {eth}/1-core (HP Table 2 layout; estimates)\n{t2}\n\n"
    ));
    let mut t3 = rackwire_bench::table();
    let cols: Vec<String> =
        [eth, "PCIe"].iter().flat_map(|n| cores.iter().map(move |k| format!("{n} {k}-core"))).collect();
    t3.set_header(std::iter::once("grep".to_string()).chain(cols.iter().cloned()));
    for r in &grep_rows {
        let mut row = vec![r["variant"].as_str().unwrap_or("").to_string()];
        row.extend(cols.iter().map(|c| r[c.as_str()].as_f64().map(pct).unwrap_or_default()));
        t3.add_row(row);
    }
    text.push_str(&format!(
        "Grep energy efficiency improvement over {eth}/1-core (HP Table 3 layout; estimates)\n{t3}\n\n"
    ));
    let mut tm = rackwire_bench::table();
    tm.set_header(["24 servers", "Gbit/s", "switch W", "adapters W", "total W", "W per Gbit/s"]);
    for r in &marlin {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        tm.add_row([
            r["interconnect"].as_str().unwrap_or("").to_string(),
            format!("{:.0}", f("total_gbit")),
            format!("{:.0}", f("switch_watts")),
            format!("{:.1}", f("adapter_watts")),
            format!("{:.1}", f("total_watts")),
            format!("{:.3}", f("watts_per_gbit")),
        ]);
    }
    text.push_str(&format!("Interconnect power for a rack (Marlin Table 3, from the power table)\n{tm}\n\n"));
    text.push_str(MODEL_NOTE);
    Ok((doc, text))
}
