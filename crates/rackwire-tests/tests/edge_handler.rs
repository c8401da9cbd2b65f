//! Messages over the edge transport handed to a handler as they arrive.

use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rackwire::{EdgeMessageHandler, EdgeWatch, Error, ManagementHost, Op};

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
    receiver.edge().set_message_handler(move |from, data| sink.lock().unwrap().push((from, data.to_vec()))).unwrap();
    let again = receiver.edge().set_message_handler(|_, _| {}).unwrap_err();
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

/// A handler that notes each batch it is given: its messages' first bytes.
struct Batches(Mutex<Vec<Vec<u8>>>);

impl EdgeMessageHandler for Batches {
    fn messages(&self, batch: &[(rackwire::NodeId, Vec<u8>)]) {
        self.0.lock().unwrap().push(batch.iter().map(|(_, m)| m[0]).collect());
    }
}

/// Messages of the batch test (a bounded load).
const BATCHED: u8 = 200;

// Checks that a handler given batches gets every message once, in order, in batches none of
// which is empty: 200 one-byte messages sent without waiting (so several may arrive in one
// round) reach it whole, their batches' concatenation the messages in the order sent.
// Bounded: 20 s.
#[test]
fn a_handler_is_given_the_messages_received_together() {
    let (_mh, rx, _tx, conn) = rackwire_tests::thread_pair(SECRET, "batch-rx", "batch-tx", true);
    let seen = Arc::new(Batches(Mutex::default()));
    rx.edge().set_handler(seen.clone()).unwrap();
    let ops: Vec<Op> = (0..BATCHED).map(|i| conn.send(&[i])).collect();
    for op in ops {
        op.wait().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let batches = seen.0.lock().unwrap().clone();
        let got: Vec<u8> = batches.concat();
        if got.len() >= BATCHED as usize {
            assert_eq!(got, (0..BATCHED).collect::<Vec<_>>(), "out of order or twice");
            assert!(batches.iter().all(|b| !b.is_empty()), "an empty batch");
            break;
        }
        assert!(Instant::now() < deadline, "only {} of {BATCHED} arrived: {batches:?}", got.len());
        std::thread::sleep(Duration::from_millis(5));
    }
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

/// Pings of the edge watch test (a bounded load).
const PINGS: usize = 200;

/// The test's stand-in for `rw0`: a socket where "answers" appear, which the watch reads and
/// sends back over the connection; and what it saw.
struct Echo {
    answers: UnixStream,
    conn: rackwire::Conn,
    watching: AtomicBool,
    /// Bytes taken, by the edge transport's network thread while it was watching.
    taken: AtomicUsize,
    /// Anything taken elsewhere, or while not watching.
    wrong: AtomicUsize,
    sent: Mutex<Vec<Op>>,
}

impl EdgeWatch for Echo {
    fn fd(&self) -> BorrowedFd<'_> {
        self.answers.as_fd()
    }

    fn watching(&self, on: bool) {
        self.watching.store(on, Ordering::SeqCst);
    }

    fn take(&self) -> bool {
        let mut got = [0u8; 64];
        let Ok(n) = (&self.answers).read(&mut got) else { return false };
        let right = std::thread::current().name() == Some("rw-edge") && self.watching.load(Ordering::SeqCst);
        let count = if right { &self.taken } else { &self.wrong };
        count.fetch_add(n, Ordering::SeqCst);
        for b in &got[..n] {
            // Sent, not waited for (the watch must not wait).
            self.sent.lock().unwrap().push(self.conn.send(&[*b]));
        }
        n > 0
    }
}

// Checks the edge watch (`EdgeHooks::set_watch`): a node whose edge message handler makes
// an "answer" appear on a socket of its own (as the virtual NIC's packets make answers appear
// in rw0), with nothing else reading that socket, gets every answer read by the edge
// transport's network thread while it says it watches, and sent back: each of 200 one-byte
// pings is answered with the same byte within 5 s. Once the pings stop, the thread says it
// stopped watching (before it sleeps) within 5 s; every answer's send succeeds. Clearing the
// watch leaves an answer unread (nothing takes it within 100 ms).
#[test]
fn the_network_thread_takes_answers_from_the_watched_descriptor() {
    let (_mh, b, a, conn) = rackwire_tests::thread_pair(SECRET, "watch-b", "watch-a", true);
    let (handler_end, watched_end) = UnixStream::pair().unwrap();
    watched_end.set_nonblocking(true).unwrap();
    let handler_end = Mutex::new(handler_end);
    b.edge().set_message_handler(move |_, data| handler_end.lock().unwrap().write_all(data).unwrap()).unwrap();
    let echo = Arc::new(Echo {
        answers: watched_end.try_clone().unwrap(),
        conn: b.connect(a.id()).unwrap(),
        watching: AtomicBool::new(false),
        taken: AtomicUsize::new(0),
        wrong: AtomicUsize::new(0),
        sent: Mutex::default(),
    });
    b.edge().set_watch(echo.clone());
    for i in 0..PINGS {
        let ping = [(i % 251) as u8];
        conn.send(&ping).wait().unwrap();
        let pong = a.recv_timeout(Duration::from_secs(5)).unwrap_or_else(|e| panic!("ping {i} unanswered: {e}"));
        assert_eq!(pong.data, ping, "ping {i} answered with something else");
    }
    assert_eq!(echo.taken.load(Ordering::SeqCst), PINGS, "answers taken by the network thread while watching");
    assert_eq!(echo.wrong.load(Ordering::SeqCst), 0, "answers taken on another thread or while not watching");
    let deadline = Instant::now() + Duration::from_secs(5);
    while echo.watching.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the network thread still says it watches, 5 s after the last ping");
        std::thread::sleep(Duration::from_millis(5));
    }
    for op in echo.sent.lock().unwrap().drain(..) {
        op.wait().unwrap();
    }
    b.edge().clear_watch();
    conn.send(&[7]).wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut left = [0u8; 8];
    assert_eq!((&watched_end).read(&mut left).ok(), Some(1), "an answer was taken after the watch was cleared");
}
