//! Signals over the edge transport when the receiver goes right after seeing one.

use std::time::{Duration, Instant};

use rackwire::{Access, ManagementHost, OpFlags, Signal};
use rackwire_tests::thread_node;

const SECRET: &str = "edge-signal-test-secret-01234567";
/// Receivers started and closed, one signal each (a bounded load).
const ROUNDS: usize = 10;

// Checks that the answers a transport holds for a reply go out when its fabric closes: a
// receiver polls its region, driving the transport as a collective's rank does, until a signal
// lands (which makes its transport hold the answer it owes, for the reply that usually
// follows), and is then dropped at once; the sender's write-with-signal must complete (a
// closing connection dropped what it owed, and the sender saw its peer gone; that failed within
// three rounds). Ten fresh receivers; every wait has a deadline.
#[test]
fn a_signal_seen_just_before_the_receiver_closes_completes() {
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    let sender = thread_node(&mh, SECRET, "signal-tx", true);
    for round in 0..ROUNDS {
        let receiver = thread_node(&mh, SECRET, &format!("signal-rx-{round}"), true);
        let region = receiver.alloc(4096, Access::READ | Access::WRITE).unwrap();
        region.grant(sender.id(), Access::WRITE).unwrap();
        let conn = sender.connect(receiver.id()).unwrap();
        let mut op = conn.write_signal(&region.handle(), 64, b"data", Signal::set(0, 1), OpFlags::NONE);
        let deadline = Instant::now() + Duration::from_secs(5);
        while region.load_u64(0).unwrap() != 1 {
            assert!(Instant::now() < deadline, "round {round}: the signal never landed");
            receiver.progress();
        }
        assert_eq!(region.to_vec(64, 4).unwrap(), b"data", "round {round}: the data is in place before it");
        drop(region);
        drop(receiver);
        let got = op.wait_timeout(Duration::from_secs(5));
        assert!(got.is_ok(), "round {round}: the sender's operation ended with {got:?}");
    }
}
