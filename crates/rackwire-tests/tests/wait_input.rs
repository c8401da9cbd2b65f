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

// Checks an application's own event loop on the fabric's descriptor, over each transport:
// with nothing waiting, `arm_input` says sleep; a message a peer sends 50 ms later makes
// `input_fd` readable (a poll given ten seconds returns within five); after `disarm_input`
// the descriptor is no longer readable and the message is taken with its bytes; with a
// message already waiting, `arm_input` says look instead of sleeping.
#[test]
fn an_event_loop_sleeps_on_the_fabrics_descriptor() {
    for edge in [false, true] {
        let (_mh, rx, _tx, conn) = rackwire_tests::thread_pair(SECRET, "fd-rx", "fd-tx", edge);
        let readable = |ms: i32| {
            let fd = rx.input_fd();
            let mut p = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
            let ts = rustix::time::Timespec { tv_sec: i64::from(ms / 1000), tv_nsec: i64::from(ms % 1000) * 1_000_000 };
            rustix::event::poll(&mut p, Some(&ts)).unwrap() == 1
        };
        assert!(!rx.arm_input(), "nothing waits yet");
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            conn.send(b"ping").wait().unwrap();
            conn
        });
        let t0 = Instant::now();
        assert!(readable(LONG.as_millis() as i32), "the descriptor never turned readable (edge: {edge})");
        assert!(t0.elapsed() < LONG / 2);
        rx.disarm_input();
        assert!(!readable(0), "disarming takes the ring");
        let mut got = Vec::new();
        while got.is_empty() {
            assert!(t0.elapsed() < LONG, "the message never came");
            rx.recv_waiting_with(8, |_, data| got.push(data.to_vec())).unwrap();
        }
        assert_eq!(got, vec![b"ping".to_vec()]);
        let conn = sender.join().unwrap();
        conn.send(b"again").wait().unwrap();
        let t1 = Instant::now();
        while !rx.arm_input() {
            assert!(t1.elapsed() < LONG, "a waiting message never showed (edge: {edge})");
            rx.disarm_input();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

// Checks `recv_waiting_from` over each transport: messages from a peer it does not accept are
// not taken (a call refusing the sender takes nothing, again and again) and wait where they
// are, in order; a later call accepting it takes them all, in the order sent.
#[test]
fn messages_from_a_refused_peer_wait_in_order() {
    for edge in [false, true] {
        let (_mh, rx, tx, conn) = rackwire_tests::thread_pair(SECRET, "from-rx", "from-tx", edge);
        for i in 0..5u8 {
            conn.send(&[i]).wait().unwrap();
        }
        let mut r = rx.receiver();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(200) {
            let taken = rx.recv_waiting_from(&mut r, 8, |n| n != tx.id(), |_, _| true).unwrap();
            assert_eq!(taken, 0, "a message from a refused peer was taken (edge: {edge})");
            let _ = rx.progress();
        }
        let mut got = Vec::new();
        while got.len() < 5 {
            assert!(t0.elapsed() < LONG, "the waiting messages never came (edge: {edge}): {got:?}");
            rx.recv_waiting_from(
                &mut r,
                8,
                |n| n == tx.id(),
                |_, d| {
                    got.extend_from_slice(d);
                    true
                },
            )
            .unwrap();
            let _ = rx.progress();
        }
        assert_eq!(got, (0..5u8).collect::<Vec<_>>());
    }
}
