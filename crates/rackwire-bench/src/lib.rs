//! rackwire's micro-benchmarks: ping-pong, one-way, two-way and message rate over the fabric,
//! side by side with the physical limit (memcpy) and peers (UCX) measured in the same run.
//!
//! Each benchmark runs between two processes: this one (the initiator) and a responder child
//! started from the same executable, joined through an embedded management host.

#![deny(unsafe_code)]

pub mod coll;
pub mod cpu;
pub mod lang;
mod limit;
pub mod mpi;
mod mpi_rack;
pub mod ofi;
mod peers;
pub mod rails;
pub mod repeat;
mod report;
pub mod seal;
pub mod served;
mod shm;
pub mod spawn;
mod stats;
pub mod stripe;
pub mod vnic;
pub mod vnic_mtu;

pub use peers::{
    iperf3_path, iperf3_udp_capacity, sockperf_path, NetPath, UdpSearch, UDP_SEARCH_LARGE, UDP_SEARCH_SMALL,
};
pub use report::{markdown, print_table, table, Report, Row};
pub use shm::{responder_main, run_shm, BenchTransport, ShmBench};

use std::str::FromStr;

/// The smallest size a benchmark takes.
pub const BENCH_SIZE_MIN: u64 = 1;
/// The largest size a benchmark takes.
pub const BENCH_SIZE_MAX: u64 = 64 << 20;

/// What a benchmark measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Write then wait for the peer's write back; latency is half the round trip.
    Pingpong,
    /// A stream of writes one way; bandwidth.
    Oneway,
    /// Streams of writes both ways at once; aggregate bandwidth.
    Twoway,
    /// A stream of two-sided messages; messages per second.
    Rate,
    /// Marlin's Table 1: 10,000 writes of 4 KiB as separate operations, over several copy
    /// channels, batched, and batched with combining.
    Table1,
    /// Marlin's Fig. 6: one scatter-gather write of 2,000 pieces of one size, for each size
    /// from 128 B to 64 KiB; throughput against the pieces' size.
    Pieces,
}

impl Pattern {
    /// Its name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Pingpong => "pingpong",
            Pattern::Oneway => "oneway",
            Pattern::Twoway => "twoway",
            Pattern::Rate => "rate",
            Pattern::Table1 => "table1",
            Pattern::Pieces => "pieces",
        }
    }
}

impl FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "pingpong" => Pattern::Pingpong,
            "oneway" => Pattern::Oneway,
            "twoway" => Pattern::Twoway,
            "rate" => Pattern::Rate,
            "table1" => Pattern::Table1,
            "pieces" => Pattern::Pieces,
            _ => return Err(format!("unknown pattern {s:?} (pingpong, oneway, twoway, rate, table1, pieces)")),
        })
    }
}

/// Parse a size: a number with an optional `K`, `M` or `G` suffix (binary: 1K = 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("size {s:?} is not a number with an optional K/M/G suffix");
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, mul) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let v = n.checked_mul(mul).ok_or_else(|| format!("size {s:?} is too large"))?;
    if !(BENCH_SIZE_MIN..=BENCH_SIZE_MAX).contains(&v) {
        return Err(format!("size {s:?} outside {BENCH_SIZE_MIN}..={BENCH_SIZE_MAX} bytes"));
    }
    Ok(v)
}

/// A size in the short form tables use (8, 4K, 1M).
pub fn show_size(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks size parsing: suffixes, the bounds, and clear errors for junk.
    #[test]
    fn sizes_parse_with_suffixes_and_bounds() {
        assert_eq!(parse_size("8").unwrap(), 8);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("4m").unwrap(), 4 << 20);
        assert!(parse_size("0").is_err());
        assert!(parse_size("1G").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("é").is_err());
        assert_eq!(parse_size("64B").unwrap(), 64);
        assert_eq!(show_size(4 << 20), "4M");
        assert_eq!(show_size(4096), "4K");
        assert_eq!(show_size(100), "100");
    }

    // Checks that every pattern's name parses back to it, and that an unknown one is refused
    // with the list of names.
    #[test]
    fn patterns_parse_by_name() {
        use std::str::FromStr;
        for p in [Pattern::Pingpong, Pattern::Oneway, Pattern::Twoway, Pattern::Rate, Pattern::Table1, Pattern::Pieces]
        {
            assert_eq!(Pattern::from_str(p.name()), Ok(p));
        }
        let e = Pattern::from_str("fig6").unwrap_err();
        assert!(e.contains("pieces"), "{e}");
    }
}
