//! The harness the shared-memory tests share: a job's ranks as threads of this process.

use std::time::Duration;

use rackwire_dsm::{DsmError, Placement, SharedMemory};

const SECRET: &str = "dsm-job-test-secret-0123456789abcdef";

/// Run `body` as every rank of an `n`-rank job sharing `bytes` (each rank a thread with a
/// fabric node of its own: shared memory between them, or the edge transport on loopback);
/// each rank's result.
pub fn run(
    job: &str,
    n: usize,
    bytes: usize,
    edge: bool,
    body: impl Fn(&mut SharedMemory) -> Result<(), DsmError> + Send + Sync + 'static,
) -> Vec<Result<(), DsmError>> {
    run_with(job, n, bytes, edge, Duration::from_secs(30), Placement::FirstTouch, body)
}

/// [`run`] with the group's timeout (how long a rank waits for the others in a group call) and
/// the pages' placement.
pub fn run_with(
    job: &str,
    n: usize,
    bytes: usize,
    edge: bool,
    timeout: Duration,
    placement: Placement,
    body: impl Fn(&mut SharedMemory) -> Result<(), DsmError> + Send + Sync + 'static,
) -> Vec<Result<(), DsmError>> {
    rackwire_tests::thread_ranks(SECRET, job, n, edge, timeout, move |group| {
        let mut shared = SharedMemory::with_placement(group, bytes, placement)?;
        body(&mut shared)?;
        shared.leave()
    })
}

/// Every rank returned Ok (else the ranks' errors).
pub fn assert_all_ok(results: &[Result<(), DsmError>]) {
    let failures: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(rank, r)| r.as_ref().err().map(|e| format!("rank {rank}: {e}")))
        .collect();
    assert!(failures.is_empty(), "{failures:?}");
}
