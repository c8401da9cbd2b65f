//! Messages written in place: `Conn::send_with` over shared memory (straight into the peer's
//! ring) and over the edge transport (through a buffer).

use std::time::Duration;

use rackwire::{Error, MESSAGE_BYTES_MAX};

const SECRET: &str = "send-with-test-secret-0123456789";

// Checks, over shared memory and over the edge transport, that a message written in place
// arrives with exactly the bytes and length `fill` gave (a 1000-byte pattern in a 4096-byte
// room, then an empty one), that a `fill` returning `None` sends nothing (the receiver then
// finds no message), and that a room above the message limit is refused with
// `MessageTooLarge` without calling `fill`.
#[test]
fn messages_written_in_place_arrive_as_written() {
    for edge in [false, true] {
        let (_mh, rx, tx, conn) = rackwire_tests::thread_pair(SECRET, "in-place-rx", "in-place-tx", edge);
        let body = rackwire_tests::pattern(7, 0, 1000);

        let op = conn.send_with(4096, |room| {
            assert_eq!(room.len(), 4096, "the room asked for");
            room[..body.len()].copy_from_slice(&body);
            Some(body.len())
        });
        op.expect("sent").wait().unwrap();
        let m = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((m.from, &m.data), (tx.id(), &body), "edge: {edge}");

        assert!(conn.send_with(64, |_| None).is_none(), "a fill that gave up sent something");
        conn.send_with(64, |_| Some(0)).expect("sent").wait().unwrap();
        let m = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(m.data.is_empty(), "edge: {edge}: the empty message came as {} bytes", m.data.len());
        let none = rx.recv_timeout(Duration::from_millis(100));
        assert!(matches!(none, Err(Error::Timeout)), "edge: {edge}: {none:?}");

        let big = conn.send_with(MESSAGE_BYTES_MAX + 1, |_| panic!("fill called for a room too large"));
        let e = big.expect("refused").wait().unwrap_err();
        assert!(matches!(e, Error::MessageTooLarge { .. }), "{e:?}");
    }
}

// Checks that over shared memory a message written in place never waits for room: 64 KiB
// messages sent without the receiver taking any fill the peer's ring (1 MiB) within 64 sends,
// after which `send_with` returns `None` at once without calling `fill`; once the receiver takes
// one message, the next `send_with` is sent again; and every message sent arrives intact.
#[test]
fn a_full_ring_makes_send_with_return_without_waiting() {
    let (_mh, rx, _tx, conn) = rackwire_tests::thread_pair(SECRET, "full-rx", "full-tx", false);
    let size = 64 * 1024;
    let body = |i: usize| rackwire_tests::pattern(i as u64, 0, size);
    let mut sent = 0;
    let mut refused = false;
    for i in 0..64 {
        let mut called = false;
        let op = conn.send_with(size, |room| {
            called = true;
            room.copy_from_slice(&body(i));
            Some(size)
        });
        match op {
            Some(op) => {
                op.wait().unwrap();
                sent += 1;
            }
            None => {
                assert!(!called, "fill was called, then nothing was sent");
                refused = true;
                break;
            }
        }
    }
    assert!(refused, "64 messages of 64 KiB fit a 1 MiB ring");
    let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(first.data, body(0));
    let again = conn.send_with(size, |room| {
        room.copy_from_slice(&body(sent));
        Some(size)
    });
    again.expect("room after the receiver took one").wait().unwrap();
    for i in 1..=sent {
        let m = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(m.data, body(i), "message {i}");
    }
}
