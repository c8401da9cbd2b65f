//! The energy model: a component power table with sources (HP Table 1, Marlin Table 3;
//! `data/power.toml`), applied to a run's measured time and CPU use.
//!
//! Every figure this module computes is an **estimate from the model**, not a measurement.
//! The model, per modelled node (one rank with `cores` cores):
//!
//! ```text
//! E = T x (cores x P_idle + P_dram + P_storage + P_net) + CPU x (P_peak - P_idle)
//! ```
//!
//! with `T` the run's wall time, `CPU` the CPU seconds the rank used (at most `cores x T`),
//! `P_peak` the table's peak power per core, `P_idle = idle_fraction x P_peak` (a linear
//! idle-to-peak model per core), and `P_net` the network's NIC plus one switch port. Energy
//! efficiency is work per joule (records per joule, as JouleSort counts it); an improvement
//! is the efficiency against a baseline configuration, minus one, as HP's Tables 2 and 3
//! state it.

use serde::Deserialize;

use crate::job::RunResult;
use crate::EvalError;

/// The table shipped with the project.
pub const POWER_TABLE: &str = include_str!("../data/power.toml");

/// The component power table.
#[derive(Clone, Debug, Deserialize)]
pub struct PowerTable {
    /// The processor.
    pub cpu: Cpu,
    /// Memory.
    pub memory: Component,
    /// Storage kinds.
    pub storage: Vec<Storage>,
    /// Network kinds.
    pub network: Vec<NetworkPower>,
    /// Marlin's whole-rack comparison.
    pub rack: Vec<RackPower>,
}

/// The processor's power.
#[derive(Clone, Debug, Deserialize)]
pub struct Cpu {
    /// Which part.
    pub part: String,
    /// Peak watts per core.
    pub peak_watts_per_core: f64,
    /// Where the peak comes from.
    pub peak_source: String,
    /// Idle power as a share of peak.
    pub idle_fraction: f64,
    /// Where the idle share comes from.
    pub idle_source: String,
}

/// A component with a constant power.
#[derive(Clone, Debug, Deserialize)]
pub struct Component {
    /// Which part.
    pub part: String,
    /// Watts.
    pub watts: f64,
    /// Source.
    pub source: String,
}

/// A storage kind.
#[derive(Clone, Debug, Deserialize)]
pub struct Storage {
    /// Its name (`RAMFS`, `FIO`).
    pub name: String,
    /// Watts.
    pub watts: f64,
    /// Source.
    pub source: String,
}

/// A network kind, per node.
#[derive(Clone, Debug, Deserialize)]
pub struct NetworkPower {
    /// Its name (`1GbE`, `10GbE`, `InfiniBand QDR`, `PCIe`).
    pub name: String,
    /// The node's adapter.
    pub nic_watts: f64,
    /// The node's share of the switch.
    pub switch_port_watts: f64,
    /// Raw bandwidth per node.
    pub gbit_per_s: f64,
    /// Source.
    pub source: String,
}

impl NetworkPower {
    /// Watts per node.
    pub fn watts(&self) -> f64 {
        self.nic_watts + self.switch_port_watts
    }
}

/// One interconnect for a rack of servers (Marlin Table 3).
#[derive(Clone, Debug, Deserialize)]
pub struct RackPower {
    /// Its name.
    pub name: String,
    /// Servers.
    pub servers: u32,
    /// Bandwidth per server.
    pub gbit_per_server: f64,
    /// The top-of-rack switch.
    pub switch_watts: f64,
    /// One adapter.
    pub adapter_watts: f64,
    /// Adapters.
    pub adapters: u32,
    /// Anything else (Marlin's shared NIC).
    pub other_watts: f64,
    /// Source.
    pub source: String,
}

impl RackPower {
    /// Total bandwidth.
    pub fn total_gbit(&self) -> f64 {
        self.gbit_per_server * f64::from(self.servers)
    }

    /// Total watts.
    pub fn total_watts(&self) -> f64 {
        self.switch_watts + self.adapter_watts * f64::from(self.adapters) + self.other_watts
    }

    /// Watts per Gbit/s.
    pub fn watts_per_gbit(&self) -> f64 {
        self.total_watts() / self.total_gbit()
    }
}

/// A configuration to price a run in.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Network kind (a name of the table).
    pub network: String,
    /// Storage kind (a name of the table).
    pub storage: String,
    /// Cores per node.
    pub cores: u32,
}

/// The model's estimate for one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// Joules, all nodes.
    pub joules: f64,
    /// Average watts over the run.
    pub watts: f64,
    /// Work per joule.
    pub work_per_joule: f64,
}

impl PowerTable {
    /// The table shipped with the project.
    pub fn shipped() -> PowerTable {
        PowerTable::parse(POWER_TABLE).expect("the shipped power table parses")
    }

    /// A table from TOML text, checked: every power non-negative, the idle share in 0..=1.
    pub fn parse(text: &str) -> Result<PowerTable, EvalError> {
        let t: PowerTable = toml::from_str(text).map_err(|e| EvalError::BadArgument(format!("power table: {e}")))?;
        let bad = |what: &str| Err(EvalError::BadArgument(format!("power table: {what}")));
        if !(0.0..=1.0).contains(&t.cpu.idle_fraction) {
            return bad("cpu.idle_fraction must be within 0..=1");
        }
        let watts = [t.cpu.peak_watts_per_core, t.memory.watts]
            .into_iter()
            .chain(t.storage.iter().map(|s| s.watts))
            .chain(t.network.iter().flat_map(|n| [n.nic_watts, n.switch_port_watts]));
        if watts.into_iter().any(|w| !w.is_finite() || w < 0.0) {
            return bad("every power must be a finite number of watts, not negative");
        }
        if t.network.iter().any(|n| n.gbit_per_s <= 0.0) || t.rack.iter().any(|r| r.total_gbit() <= 0.0) {
            return bad("every bandwidth must be positive");
        }
        Ok(t)
    }

    fn network(&self, name: &str) -> Result<&NetworkPower, EvalError> {
        self.network
            .iter()
            .find(|n| n.name == name)
            .ok_or_else(|| EvalError::BadArgument(format!("power table: no network {name:?}")))
    }

    fn storage(&self, name: &str) -> Result<&Storage, EvalError> {
        self.storage
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| EvalError::BadArgument(format!("power table: no storage {name:?}")))
    }

    /// Energy of a run of `nodes` nodes that took `secs` and used `cpu_secs` of CPU, doing
    /// `work` units of work, in configuration `cfg`.
    pub fn estimate(
        &self,
        cfg: &Config,
        nodes: usize,
        secs: f64,
        cpu_secs: f64,
        work: u64,
    ) -> Result<Estimate, EvalError> {
        let net = self.network(&cfg.network)?;
        let store = self.storage(&cfg.storage)?;
        let nodes = nodes as f64;
        let cores = f64::from(cfg.cores);
        let peak = self.cpu.peak_watts_per_core;
        let idle = peak * self.cpu.idle_fraction;
        let busy = cpu_secs.clamp(0.0, nodes * cores * secs);
        let static_watts = nodes * (cores * idle + self.memory.watts + store.watts + net.watts());
        let joules = secs * static_watts + busy * (peak - idle);
        Ok(Estimate {
            joules,
            watts: if secs > 0.0 { joules / secs } else { 0.0 },
            work_per_joule: if joules > 0.0 { work as f64 / joules } else { 0.0 },
        })
    }

    /// [`PowerTable::estimate`] for a measured run: its CPU the whole machine's busy time over
    /// the run where that was read (the ranks, and what carries their data), else the ranks'.
    pub fn estimate_run(&self, cfg: &Config, run: &RunResult) -> Result<Estimate, EvalError> {
        self.estimate(cfg, run.ranks, run.secs, run.host_cpu_secs.unwrap_or(run.cpu_secs), run.work)
    }
}

/// The efficiency improvement of `e` over `base`, as HP states it (0.83 for 83% better).
pub fn improvement(e: &Estimate, base: &Estimate) -> f64 {
    if base.work_per_joule > 0.0 {
        e.work_per_joule / base.work_per_joule - 1.0
    } else {
        0.0
    }
}

/// The network kind a run stands for: the fabric between hosts of one memory domain (shared
/// memory) stands for PCIe; Ethernet paths (TCP, or the edge transport over the rails) for
/// the Ethernet their rail's rate is (1 Gbit/s or less: 1GbE; otherwise 10GbE, also for an
/// unshaped path).
pub fn network_kind(transport: &str, rail_gbit: Option<f64>) -> &'static str {
    match (transport, rail_gbit) {
        ("shm", _) => "PCIe",
        (_, Some(g)) if g <= 1.0 => "1GbE",
        _ => "10GbE",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the model's arithmetic against a case worked by hand: 2 nodes of 1 core for
    // 10 s using 12 CPU-seconds, on 1GbE and RAMFS. Static power per node is
    // 4.5 (idle core) + 6 (DRAM) + 0 (RAMFS) + 3.9 (NIC + port) = 14.4 W, so 2 x 14.4 x 10 =
    // 288 J; busy: 12 x (9 - 4.5) = 54 J; total 342 J; 1000 records: 2.924 records/J.
    #[test]
    fn estimate_matches_a_hand_computed_case() {
        let t = PowerTable::shipped();
        let cfg = Config { network: "1GbE".into(), storage: "RAMFS".into(), cores: 1 };
        let e = t.estimate(&cfg, 2, 10.0, 12.0, 1000).unwrap();
        assert!((e.joules - 342.0).abs() < 1e-9, "{e:?}");
        assert!((e.watts - 34.2).abs() < 1e-9);
        assert!((e.work_per_joule - 1000.0 / 342.0).abs() < 1e-12);
        // CPU time past cores x time is clamped: 2 nodes x 1 core x 10 s = 20 s at most.
        let capped = t.estimate(&cfg, 2, 10.0, 50.0, 1000).unwrap();
        assert!((capped.joules - (288.0 + 20.0 * 4.5)).abs() < 1e-9);
        // PCIe: static per node 4.5 + 6 + 1 = 11.5 W.
        let pcie = Config { network: "PCIe".into(), ..cfg.clone() };
        let p = t.estimate(&pcie, 2, 5.0, 6.0, 1000).unwrap();
        assert!((p.joules - (2.0 * 11.5 * 5.0 + 6.0 * 4.5)).abs() < 1e-9);
        assert!((improvement(&p, &e) - (342.0 / 142.0 - 1.0)).abs() < 1e-12);
    }

    // Checks Marlin's Table 3 from the shipped table: totals 308, 502 and 213.1 W, and
    // 1.283, 1.045 and 0.277 W per Gbit/s as the paper prints them.
    #[test]
    fn marlin_table_3_is_reproduced() {
        let t = PowerTable::shipped();
        let want = [("Ethernet", 308.0, 1.283), ("InfiniBand", 502.0, 1.045), ("PCIe", 213.1, 0.277)];
        for (name, total, per) in want {
            let r = t.rack.iter().find(|r| r.name == name).unwrap();
            assert!((r.total_watts() - total).abs() < 1e-9, "{name}");
            assert!((r.watts_per_gbit() - per).abs() < 0.001, "{name}: {}", r.watts_per_gbit());
        }
    }

    // Checks that a bad table is refused with a clear error: a negative power, an idle share
    // past 1, a missing section.
    #[test]
    fn bad_tables_are_refused() {
        let neg = POWER_TABLE.replace("watts = 6.0", "watts = -6.0");
        assert!(PowerTable::parse(&neg).unwrap_err().to_string().contains("not negative"));
        let idle = POWER_TABLE.replace("idle_fraction = 0.5", "idle_fraction = 1.5");
        assert!(PowerTable::parse(&idle).unwrap_err().to_string().contains("idle_fraction"));
        assert!(PowerTable::parse("[cpu]\n").is_err());
        let t = PowerTable::shipped();
        let cfg = Config { network: "carrier pigeon".into(), storage: "RAMFS".into(), cores: 1 };
        assert!(t.estimate(&cfg, 1, 1.0, 1.0, 1).is_err());
    }

    // Checks which network each path stands for.
    #[test]
    fn network_kinds() {
        assert_eq!(network_kind("shm", Some(1.0)), "PCIe");
        assert_eq!(network_kind("tcp", Some(1.0)), "1GbE");
        assert_eq!(network_kind("udp", Some(10.0)), "10GbE");
        assert_eq!(network_kind("tcp", None), "10GbE");
    }
}
