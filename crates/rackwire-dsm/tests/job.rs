//! Shared memory over a job on the fabric: ranks as threads of this process, each a fabric node
//! of its own (shared memory between them, or the edge transport on loopback), their ranges'
//! pages fetched with one-sided reads and their diffs written one-sided into the homes.

use std::sync::Arc;
use std::time::Duration;

use rackwire::{Fabric, FabricConfig, ManagementHost, TransportChoice};
use rackwire_coll::{Group, GroupConfig};
use rackwire_dsm::{DsmError, SharedMemory, PAGE_BYTES};

const SECRET: &str = "dsm-job-test-secret-0123456789abcdef";

/// Run `body` as every rank of an `n`-rank job sharing `bytes`; each rank's result.
fn run(
    job: &str,
    n: usize,
    bytes: usize,
    edge: bool,
    body: impl Fn(&mut SharedMemory) -> Result<(), DsmError> + Send + Sync + 'static,
) -> Vec<Result<(), DsmError>> {
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    let addr = mh.addr().to_string();
    let body = Arc::new(body);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (addr, job, body) = (addr.clone(), job.to_string(), body.clone());
            std::thread::spawn(move || -> Result<(), DsmError> {
                let mut cfg = FabricConfig::new(addr, SECRET, format!("{job}-{rank}"));
                if edge {
                    cfg.transport = TransportChoice::Edge;
                    cfg.links = vec!["127.0.0.1:0".into()];
                }
                let fabric = Arc::new(Fabric::join(cfg)?);
                let group = Group::join_with(
                    fabric,
                    &job,
                    rank,
                    n,
                    GroupConfig { timeout: Duration::from_secs(30), job_token: None },
                )?;
                let mut shared = SharedMemory::new(group, bytes)?;
                body(&mut shared)?;
                shared.leave()
            })
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect();
    drop(mh);
    out
}

fn assert_all_ok(results: &[Result<(), DsmError>]) {
    let failures: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(rank, r)| r.as_ref().err().map(|e| format!("rank {rank}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{failures:?}");
}

/// Each rank writes its own bytes on every page (false sharing on every page), a barrier, then
/// every rank reads every byte written; twice, the second round over the first's values.
fn every_rank_sees_every_write(n: usize, edge: bool) {
    const PAGES: usize = 6;
    let results = run(&format!("dsm{n}{}", if edge { "e" } else { "s" }), n, PAGES * PAGE_BYTES, edge, move |m| {
        let (me, size) = (m.rank(), m.size());
        for round in 0..2u8 {
            for page in 0..PAGES {
                for k in 0..8 {
                    let at = page * PAGE_BYTES + (k * size + me) * 8;
                    m.range().write(at, round * 100 + (me * 10 + k) as u8 + 1)?;
                }
            }
            m.barrier()?;
            for page in 0..PAGES {
                for r in 0..size {
                    for k in 0..8 {
                        let at = page * PAGE_BYTES + (k * size + r) * 8;
                        let want = round * 100 + (r * 10 + k) as u8 + 1;
                        let got = m.range().read(at)?;
                        assert_eq!(got, want, "rank {me} round {round}: page {page}, rank {r}'s word {k}");
                    }
                }
            }
            m.barrier()?;
        }
        let c = m.range().counters();
        assert!(c.fetches > 0 && c.twins > 0 && c.diffs > 0 && c.invalidations > 0, "{c:?}");
        Ok(())
    });
    assert_all_ok(&results);
}

// Checks, at 2 and 3 ranks over shared memory, that every rank sees every other rank's writes
// after a barrier — pages written by several ranks at once (each its own words), read back by
// every rank, over two rounds — and that the run really fetched, twinned, diffed and
// invalidated (its counters).
#[test]
fn every_rank_sees_every_write_over_shared_memory() {
    every_rank_sees_every_write(2, false);
    every_rank_sees_every_write(3, false);
}

// Checks the same at 2 ranks over the edge transport (fetches and diffs as edge operations).
#[test]
fn every_rank_sees_every_write_over_the_edge_transport() {
    every_rank_sees_every_write(2, true);
}
