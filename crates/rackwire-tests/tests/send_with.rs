//! Messages written in place: `Conn::send_with` over shared memory (straight into the peer's
//! ring) and over the edge transport (through a buffer).

use std::time::Duration;

use rackwire::{Error, ManagementHost, MESSAGE_BYTES_MAX};

const SECRET: &str = "send-with-test-secret-0123456789";

// Checks, over shared memory and over the edge transport, that a message written in place
// arrives with exactly the bytes and length `fill` gave (a 1000-byte pattern in a 4096-byte
// room, then an empty one), that a `fill` returning `None` sends nothing (the receiver then
// finds no message), and that a room above the message limit is refused with
// `MessageTooLarge` without calling `fill`.
#[test]
fn messages_written_in_place_arrive_as_written() {
    for edge in [false, true] {
        let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
        let rx = rackwire_tests::thread_node(&mh, SECRET, "in-place-rx", edge);
        let tx = rackwire_tests::thread_node(&mh, SECRET, "in-place-tx", edge);
        let conn = tx.connect(rx.id()).unwrap();
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
