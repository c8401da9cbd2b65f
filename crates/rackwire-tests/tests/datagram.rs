//! `Conn::send_datagram` between two nodes, over the edge transport and over shared memory.

use std::time::{Duration, Instant};

use rackwire::{Error, Fabric};

const SECRET: &str = "datagram-test-secret-0123456789ab";
/// Datagrams each test sends (a bounded load).
const DATAGRAMS: usize = 200;

/// Datagram `i`: its number, then bytes of a pattern, 4 + (i * 7) % 900 bytes long.
fn body(i: usize) -> Vec<u8> {
    let mut d = (i as u32).to_le_bytes().to_vec();
    d.resize(4 + (i * 7) % 900, (i % 251) as u8);
    d
}

/// Send the datagrams one at a time, each answered by the receiver before the next goes (no
/// loss on loopback, no queue overflow), and check each arrives once, whole, from the sender.
fn ping_datagrams(rx: &Fabric, tx: &Fabric, conn: &rackwire::Conn) {
    ping_datagrams_n(rx, tx, conn, DATAGRAMS);
}

/// [`ping_datagrams`] with the first `n` of them.
fn ping_datagrams_n(rx: &Fabric, tx: &Fabric, conn: &rackwire::Conn, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0..n {
        conn.send_datagram(&body(i)).unwrap();
        let m = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("datagram arrives");
        assert_eq!(m.from, tx.id());
        assert_eq!(m.data, body(i), "datagram {i} changed");
    }
}

// Checks datagrams over the edge transport (a loopback link of 1472-byte frames): each of a
// bounded sequence reaches the receiver once and unchanged as a message from the sender; one
// larger than a frame is refused as too large, naming the largest (which is below the link's
// frame size), and nothing of it arrives. The sender's connection counts each as a datagram
// sent, none dropped.
#[test]
fn edge_datagrams_arrive_as_messages_and_larger_ones_are_refused() {
    let (_mh, rx, tx, conn) = rackwire_tests::thread_pair(SECRET, "dgram-rx", "dgram-tx", true);
    ping_datagrams(&rx, &tx, &conn);
    let stats = conn.stats().edge_or_zero();
    assert_eq!((stats.datagrams_sent, stats.datagrams_dropped), (DATAGRAMS as u64, 0), "{stats:?}");
    match conn.send_datagram(&[7u8; 2000]) {
        Err(Error::MessageTooLarge { len: 2000, max }) => assert!(max > 1000 && max < 1472, "{max}"),
        other => panic!("a 2000-byte datagram over 1472-byte frames: {other:?}"),
    }
    assert!(matches!(rx.recv_timeout(Duration::from_millis(100)), Err(Error::Timeout)), "something of it arrived");
}

// Checks datagrams over shared memory: each of the same sequence reaches the receiver once and
// unchanged as a message; one past the largest message is refused as too large.
#[test]
fn shared_memory_datagrams_arrive_as_messages() {
    let (_mh, rx, tx, conn) = rackwire_tests::thread_pair(SECRET, "dgram-shm-rx", "dgram-shm-tx", false);
    ping_datagrams(&rx, &tx, &conn);
    let big = vec![0u8; rackwire::MESSAGE_BYTES_MAX + 1];
    assert!(matches!(conn.send_datagram(&big), Err(Error::MessageTooLarge { .. })));
}

/// Datagrams of a held burst (within one batch of the edge transport's sends).
const BURST: usize = 40;

/// Receive `n` messages from `tx` within 10 s: their bodies, in the order they came.
fn take(rx: &Fabric, tx: &Fabric, n: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    (0..n)
        .map(|_| {
            let m = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())).expect("datagram arrives");
            assert_eq!(m.from, tx.id());
            m.data
        })
        .collect()
}

// Checks that datagrams sent with `send_datagram_more` over the edge transport are held back
// (nothing of a burst of 40 arrives within 200 ms, as nothing else on the sender's side sends
// or polls meanwhile) and that `send_held` then sends every one of them, unchanged; and that a
// plain `send_datagram` after a second held burst takes the burst with it (all 41 arrive with
// no `send_held`). Each datagram is counted once as sent, none dropped. Arrival sets are
// compared sorted: datagrams carry no order.
#[test]
fn edge_datagrams_held_go_with_the_next_send() {
    let (_mh, rx, tx, conn) = rackwire_tests::thread_pair(SECRET, "dgram-held-rx", "dgram-held-tx", true);
    // One datagram first: the connection is up and its link chosen before anything is held.
    ping_datagrams_n(&rx, &tx, &conn, 1);
    for i in 0..BURST {
        conn.send_datagram_more(&body(i)).unwrap();
    }
    assert!(matches!(rx.recv_timeout(Duration::from_millis(200)), Err(Error::Timeout)), "a held datagram went out");
    conn.send_held();
    let mut got = take(&rx, &tx, BURST);
    got.sort();
    let mut want: Vec<Vec<u8>> = (0..BURST).map(body).collect();
    want.sort();
    assert_eq!(got, want);
    for i in 0..BURST {
        conn.send_datagram_more(&body(BURST + i)).unwrap();
    }
    conn.send_datagram(&body(2 * BURST)).unwrap();
    let mut got = take(&rx, &tx, BURST + 1);
    got.sort();
    let mut want: Vec<Vec<u8>> = (BURST..=2 * BURST).map(body).collect();
    want.sort();
    assert_eq!(got, want);
    let stats = conn.stats().edge_or_zero();
    assert_eq!((stats.datagrams_sent, stats.datagrams_dropped), (2 * BURST as u64 + 2, 0), "{stats:?}");
}

// Checks that over shared memory, where a datagram costs no system call, one sent with
// `send_datagram_more` is not held: it arrives with no `send_held` after it.
#[test]
fn shared_memory_datagrams_are_not_held() {
    let (_mh, rx, tx, conn) = rackwire_tests::thread_pair(SECRET, "dgram-shm-more-rx", "dgram-shm-more-tx", false);
    conn.send_datagram_more(&body(3)).unwrap();
    assert_eq!(take(&rx, &tx, 1), vec![body(3)]);
}
