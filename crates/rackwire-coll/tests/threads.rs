//! Groups whose ranks are threads of this test process, each with a fabric node of its own
//! (they reach each other over shared memory, or over the edge transport on loopback).

use std::sync::Arc;
use std::time::Duration;

use rackwire::{Fabric, FabricConfig, ManagementHost, TransportChoice};
use rackwire_coll::{CollError, Group, GroupConfig, ReduceOp};

const SECRET: &str = "coll-thread-test-secret-0123456789";

/// Run `body` as every rank of an `n`-rank group and return each rank's result.
fn run<T: Send + 'static>(
    job: &str,
    n: usize,
    edge: bool,
    body: impl Fn(&mut Group) -> Result<T, CollError> + Send + Sync + 'static,
) -> Vec<Result<T, CollError>> {
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    let addr = mh.addr().to_string();
    let body = Arc::new(body);
    let handles: Vec<_> = (0..n)
        .map(|rank| {
            let (addr, job, body) = (addr.clone(), job.to_string(), body.clone());
            std::thread::spawn(move || {
                let mut cfg = FabricConfig::new(addr, SECRET, format!("{job}-{rank}"));
                if edge {
                    cfg.transport = TransportChoice::Edge;
                    cfg.links = vec!["127.0.0.1:0".into()];
                }
                let fabric = Arc::new(Fabric::join(cfg)?);
                let cfg = GroupConfig { timeout: Duration::from_secs(20) };
                let mut g = Group::join_with(fabric, &job, rank, n, cfg)?;
                body(&mut g)
            })
        })
        .collect();
    let out = handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect();
    drop(mh);
    out
}

fn pattern(rank: usize, len: usize, salt: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) ^ rank.wrapping_mul(131) ^ salt.wrapping_mul(7)) as u8).collect()
}

// Checks every collective at three group sizes over shared memory, with a few sizes that fall
// on both sides of each algorithm switch and of the slot size, against results computed here
// from the same patterns every rank uses. Any mismatch fails with the rank and collective.
#[test]
fn every_collective_agrees_with_a_local_computation() {
    every_collective(false, &[1, 2, 3]);
}

// The same over the edge transport (UDP on loopback) for three ranks.
#[test]
fn every_collective_agrees_over_the_edge_transport() {
    every_collective(true, &[3]);
}

fn every_collective(edge: bool, sizes: &[usize]) {
    for &n in sizes {
        let results = run(&format!("t{n}{}", if edge { "e" } else { "s" }), n, edge, move |g| {
            if n > 1 {
                assert_eq!(g.transport((g.rank() + 1) % n), Some(if edge { "edge" } else { "shm" }));
            }
            let (me, n) = (g.rank(), g.size());
            for (salt, len) in [0usize, 1, 8, 1000, 70_000, 300_000].into_iter().enumerate() {
                let root = salt % n;
                g.barrier()?;
                let mut buf = if me == root { pattern(root, len, salt) } else { vec![0; len] };
                g.bcast(root, &mut buf)?;
                assert_eq!(buf, pattern(root, len, salt), "bcast len {len} rank {me}");
                let all: Vec<u8> = (0..n).flat_map(|r| pattern(r, len, salt)).collect();
                let mut got = vec![0; len];
                g.scatter(root, if me == root { &all } else { &[] }, &mut got)?;
                assert_eq!(got, pattern(me, len, salt), "scatter len {len} rank {me}");
                let mut gathered = vec![0; if me == root { n * len } else { 0 }];
                g.gather(root, &pattern(me, len, salt), &mut gathered)?;
                if me == root {
                    assert_eq!(gathered, all, "gather len {len}");
                }
                let mut ag = vec![0; n * len];
                g.allgather(&pattern(me, len, salt), &mut ag)?;
                assert_eq!(ag, all, "allgather len {len} rank {me}");
                // alltoall: block j of rank i is pattern(i * n + j).
                let send: Vec<u8> = (0..n).flat_map(|j| pattern(me * n + j, len, salt)).collect();
                let mut recv = vec![0; n * len];
                g.alltoall(&send, &mut recv)?;
                let want: Vec<u8> = (0..n).flat_map(|i| pattern(i * n + me, len, salt)).collect();
                assert_eq!(recv, want, "alltoall len {len} rank {me}");
                let elems = len / 8 + 1;
                let mut v: Vec<u64> = (0..elems).map(|i| (i * 7 + me * 1000) as u64).collect();
                g.allreduce(&mut v, ReduceOp::Sum)?;
                let want: Vec<u64> = (0..elems).map(|i| (0..n).map(|r| (i * 7 + r * 1000) as u64).sum()).collect();
                assert_eq!(v, want, "allreduce len {len} rank {me}");
                let mut f: Vec<f64> = (0..elems).map(|i| i as f64 - me as f64).collect();
                g.reduce(root, &mut f, ReduceOp::Min)?;
                if me == root {
                    let want: Vec<f64> = (0..elems).map(|i| i as f64 - (n - 1) as f64).collect();
                    assert_eq!(f, want, "reduce min len {len}");
                }
            }
            Ok(())
        });
        for (rank, r) in results.into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("n={n} rank {rank}: {e}"));
        }
    }
}
