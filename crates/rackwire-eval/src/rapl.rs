//! The processor's own energy counters (Intel RAPL through `/sys/class/powercap`), where the
//! kernel offers them and they are readable: a measurement to set beside the model's
//! estimate. Only the package domains (`intel-rapl:N`) are summed; their sub-domains (cores,
//! DRAM) are parts of them.

use std::path::{Path, PathBuf};

/// Where the kernel publishes the counters.
pub const POWERCAP: &str = "/sys/class/powercap";
/// Package domains read at most.
const DOMAINS_MAX: usize = 64;

/// One package domain's counter.
#[derive(Clone, Debug)]
struct Domain {
    energy: PathBuf,
    /// The counter wraps to zero past this (µJ).
    range_uj: u64,
}

/// A reading of every package domain, to subtract from a later one.
#[derive(Clone, Debug)]
pub struct Rapl {
    domains: Vec<Domain>,
    start_uj: Vec<u64>,
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

impl Rapl {
    /// Start reading the counters under `root` (normally [`POWERCAP`]); `None` when there are
    /// none or they cannot be read (the counters are root-only on recent kernels).
    pub fn start(root: &Path) -> Option<Rapl> {
        let mut domains: Vec<Domain> = std::fs::read_dir(root)
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                // Packages are `intel-rapl:N`; `intel-rapl:N:M` are their parts.
                name.strip_prefix("intel-rapl:").is_some_and(|rest| !rest.contains(':'))
            })
            .take(DOMAINS_MAX)
            .filter_map(|e| {
                let dir = e.path();
                let range_uj = read_u64(&dir.join("max_energy_range_uj"))?;
                Some(Domain { energy: dir.join("energy_uj"), range_uj })
            })
            .collect();
        domains.sort_by(|a, b| a.energy.cmp(&b.energy));
        let start_uj = domains.iter().map(|d| read_u64(&d.energy)).collect::<Option<Vec<_>>>()?;
        (!domains.is_empty()).then_some(Rapl { domains, start_uj })
    }

    /// Joules used since [`Rapl::start`], over every package (a counter that wrapped once is
    /// counted through its range); `None` if a counter can no longer be read.
    pub fn joules(&self) -> Option<f64> {
        let mut uj = 0u64;
        for (d, &start) in self.domains.iter().zip(&self.start_uj) {
            let now = read_u64(&d.energy)?;
            uj += if now >= start { now - start } else { d.range_uj.saturating_sub(start) + now };
        }
        Some(uj as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the reading against a fake powercap folder: two packages summed, a sub-domain
    // left out, a wrapped counter counted through its range, and no folder meaning none.
    #[test]
    fn packages_are_summed_and_wraps_counted() {
        let root = std::env::temp_dir().join(format!("rackwire-rapl-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dom = |name: &str, energy: u64, range: u64| {
            let d = root.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("energy_uj"), format!("{energy}\n")).unwrap();
            std::fs::write(d.join("max_energy_range_uj"), format!("{range}\n")).unwrap();
        };
        dom("intel-rapl:0", 1_000_000, 10_000_000);
        dom("intel-rapl:1", 9_000_000, 10_000_000);
        dom("intel-rapl:0:0", 5, 10_000_000);
        let r = Rapl::start(&root).expect("two packages");
        dom("intel-rapl:0", 3_500_000, 10_000_000); // +2.5 J
        dom("intel-rapl:1", 500_000, 10_000_000); // wrapped: +1.0 + 0.5 J
        dom("intel-rapl:0:0", 9_999_999, 10_000_000); // a part: not counted
        let j = r.joules().unwrap();
        assert!((j - 4.0).abs() < 1e-9, "{j}");
        std::fs::remove_dir_all(&root).unwrap();
        assert!(Rapl::start(&root).is_none());
    }
}
