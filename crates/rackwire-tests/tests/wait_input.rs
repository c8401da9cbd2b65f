//! One thread serving the fabric's messages and a descriptor of its own: `Fabric::wait_input`
//! and `Fabric::recv_waiting_with` (what the virtual NIC's thread is built on).

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const SECRET: &str = "wait-input-test-secret-0123456789";
/// Longer than any wake-up takes: a wait that returns before it was woken, not timed out.
const LONG: Duration = Duration::from_secs(10);

// Checks that a wait on the fabric and a descriptor returns when the descriptor becomes
// readable (no message involved): a thread writes one byte into a socket pair 50 ms after the
// wait began, and the wait, given ten seconds, returns within five. Then that a message sent
// by a peer over shared memory ends a wait with no descriptor, and is taken by
// `recv_waiting_with` with its sender and bytes.
#[test]
fn a_wait_ends_on_a_readable_descriptor_or_a_message() {
    let (_mh, rx, tx, conn) = rackwire_tests::thread_pair(SECRET, "wait-rx", "wait-tx", false);

    let (a, mut b) = UnixStream::pair().unwrap();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        b.write_all(&[1]).unwrap();
        b
    });
    let t0 = Instant::now();
    rx.wait_input(&[a.as_fd()], LONG).unwrap();
    assert!(t0.elapsed() < LONG / 2, "the wait did not end when the descriptor became readable");
    drop(writer.join().unwrap());

    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        conn.send(b"ping").wait().unwrap();
        conn
    });
    let t0 = Instant::now();
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(t0.elapsed() < LONG, "the message never came");
        rx.wait_input(&[], LONG).unwrap();
        rx.recv_waiting_with(8, |from, data| got.push((from, data.to_vec()))).unwrap();
    }
    assert!(t0.elapsed() < LONG / 2, "the wait did not end when the message came");
    assert_eq!(got, vec![(tx.id(), b"ping".to_vec())]);
    drop(sender.join().unwrap());
}

// Checks that `recv_waiting_with` takes at most the number asked for, in the order sent, and
// never waits: ten numbered messages sent, then taken four, four, two; a fourth call finds
// nothing and returns 0 at once; and that a wait with a message already waiting returns at
// once (given ten seconds, it returns within five).
#[test]
fn recv_waiting_takes_at_most_what_is_asked_in_order() {
    let (_mh, rx, _tx, conn) = rackwire_tests::thread_pair(SECRET, "batch-rx", "batch-tx", false);
    // The receiver learns of the connection when the sender's first message arrives (over
    // shared memory the sender's connect sets up the rings): send one and take it first.
    conn.send(&[255]).wait().unwrap();
    let t0 = Instant::now();
    let mut first = Vec::new();
    while first.is_empty() {
        assert!(t0.elapsed() < LONG, "the first message never came");
        rx.wait_input(&[], Duration::from_millis(100)).unwrap();
        rx.recv_waiting_with(1, |_, d| first.push(d.to_vec())).unwrap();
    }
    assert_eq!(first, vec![vec![255]]);

    for i in 0..10u8 {
        conn.send(&[i]).wait().unwrap();
    }
    let t0 = Instant::now();
    rx.wait_input(&[], LONG).unwrap();
    assert!(t0.elapsed() < LONG / 2, "a wait with a message waiting did not return at once");
    let mut got = Vec::new();
    let counts: Vec<usize> =
        [4, 4, 4, 4].iter().map(|&max| rx.recv_waiting_with(max, |_, d| got.extend_from_slice(d)).unwrap()).collect();
    assert_eq!(counts, vec![4, 4, 2, 0]);
    assert_eq!(got, (0..10u8).collect::<Vec<_>>());
}
