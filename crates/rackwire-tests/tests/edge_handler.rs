//! Messages over the edge transport handed to a handler as they arrive.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rackwire::{Error, ManagementHost};

const SECRET: &str = "edge-handler-test-secret-0123456";
/// Messages the test sends (a bounded load).
const MESSAGES: u32 = 2_000;

/// What the handler was given: sender and bytes, in order.
type Received = Arc<Mutex<Vec<(rackwire::NodeId, Vec<u8>)>>>;

// Checks that with an edge message handler set, every message a peer sends over the edge
// transport reaches the handler exactly once and in the order sent (numbered messages of
// varying sizes, up to several frames each), none is left for the receive calls (which time
// out), a second handler is refused with a clear error, and the sender's operations all
// complete. Bounded in count and time (a deadline of 20 s).
#[test]
fn edge_messages_reach_the_handler_in_order() {
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    let receiver = rackwire_tests::thread_node(&mh, SECRET, "handler-rx", true);
    let sender = rackwire_tests::thread_node(&mh, SECRET, "handler-tx", true);
    let got: Received = Arc::default();
    let sink = got.clone();
    receiver.set_edge_message_handler(move |from, data| sink.lock().unwrap().push((from, data.to_vec()))).unwrap();
    let again = receiver.set_edge_message_handler(|_, _| {}).unwrap_err();
    assert!(matches!(&again, Error::Config(m) if m.contains("set already")), "{again:?}");
    let conn = sender.connect(receiver.id()).unwrap();
    let body = |i: u32| {
        let mut m = i.to_le_bytes().to_vec();
        m.resize(4 + (i as usize * 37) % 5000, (i % 251) as u8);
        m
    };
    for i in 0..MESSAGES {
        conn.send(&body(i)).wait().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.lock().unwrap().len() < MESSAGES as usize {
        assert!(Instant::now() < deadline, "only {} of {MESSAGES} arrived", got.lock().unwrap().len());
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = got.lock().unwrap();
    assert_eq!(got.len(), MESSAGES as usize, "a message came twice");
    for (i, (from, m)) in got.iter().enumerate() {
        assert_eq!(*from, sender.id());
        assert_eq!(m, &body(i as u32), "message {i} out of order or changed");
    }
    let left = receiver.recv_timeout(Duration::from_millis(50));
    assert!(matches!(left, Err(Error::Timeout)), "a message was left for recv: {left:?}");
}

// Checks that an edge connection's liveness, which the receive calls look up without the
// endpoint's lock while no connection closed, still follows a close: a connection to a peer
// is alive (looked at twice: the second answer comes from what the first looked up), then,
// once the peer closes its fabric (its close frames reach us), it reads as not alive within
// ten seconds, and a send on it fails.
#[test]
fn an_edge_connection_reads_as_closed_once_its_peer_closes() {
    let (_mh, b, _a, conn) = rackwire_tests::thread_pair(SECRET, "alive-b", "alive-a", true);
    conn.send(b"hello").wait().unwrap();
    assert!(conn.is_alive() && conn.is_alive(), "a fresh connection reads as closed");
    b.close();
    let deadline = Instant::now() + Duration::from_secs(10);
    while conn.is_alive() {
        assert!(Instant::now() < deadline, "the connection still reads as alive after its peer closed");
        std::thread::sleep(Duration::from_millis(5));
    }
    let e = conn.send(b"after").wait();
    assert!(e.is_err(), "a send on a closed connection succeeded");
}
