//! The applications over a job's shared memory, each checked against its one-process run.

use common::{assert_all_ok, run};
use rackwire_dsm::apps::{lu, Memory, Plain};

mod common;

/// LU of a 64 x 64 matrix of 8 x 8 blocks (eight blocks to a page: pages written by several
/// ranks at once) over `n` ranks; rank 0 compares every word with the one-process run's.
fn lu_matches_one_process(n: usize, edge: bool) {
    let s = lu::Shape { n: 64, b: 8 };
    let mut plain = Plain(vec![0.0; s.words()]);
    lu::init(&mut plain, s, 11).unwrap();
    lu::factorise(&mut plain, s).unwrap();
    let want = plain.0;
    let results = run(&format!("lu{n}{}", if edge { "e" } else { "s" }), n, s.words() * 8, edge, move |m| {
        lu::init(m, s, 11)?;
        lu::factorise(m, s)?;
        if m.rank() == 0 {
            for (i, w) in want.iter().enumerate() {
                let got = m.get(i)?;
                assert_eq!(got.to_bits(), w.to_bits(), "word {i}: {got} against the one-process run's {w}");
            }
        }
        m.barrier()
    });
    assert_all_ok(&results);
}

// Checks LU over the shared memory at 1, 2 and 3 ranks over shared memory: the factorised
// matrix equals the one-process run's bit for bit (every block takes the same operations in
// the same order whoever owns it).
#[test]
fn lu_over_shared_memory_equals_one_process() {
    for n in [1, 2, 3] {
        lu_matches_one_process(n, false);
    }
}

// Checks the same at 2 ranks over the edge transport.
#[test]
fn lu_over_the_edge_transport_equals_one_process() {
    lu_matches_one_process(2, true);
}
