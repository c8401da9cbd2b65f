//! A connection's counters say what its operations did, whichever transport carries them.

use std::time::Duration;

use rackwire::{Access, Fabric, ManagementHost, OpFlags};

const SECRET: &str = "stats-test-secret-0123456789abcd";

fn node(mh: &rackwire::MhHandle, name: &str, edge: bool) -> Fabric {
    rackwire_tests::thread_node(mh, SECRET, name, edge)
}

// Checks, on the shared-memory and the edge transport alike, the counters every transport
// keeps: after one 100-byte write with a notification, one 16-byte read, one fetch-and-add
// and one message (each waited for, the notification and message taken at the owner), the
// initiator's connection counts exactly one of each with their bytes; and its own transport's
// part is there, the other's not (shared memory: its ring counters; the edge transport: its
// frames, sealed). The edge transport counted none of the operations before (its writes,
// reads, atomics, messages and bytes read were 0).
#[test]
fn operations_are_counted_on_both_transports() {
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    for edge in [false, true] {
        let tag = if edge { "edge" } else { "shm" };
        let owner = node(&mh, &format!("stats-owner-{tag}"), edge);
        let user = node(&mh, &format!("stats-user-{tag}"), edge);
        let region = owner.alloc(4096, Access::ALL).unwrap();
        region.grant(user.id(), Access::ALL).unwrap();
        let conn = user.connect(owner.id()).unwrap();
        assert_eq!(conn.transport(), if edge { "edge" } else { "shm" });
        let h = region.handle();
        let notify = OpFlags::NONE.notify(7);
        conn.write(&h, 0, &[1u8; 100], notify).wait().unwrap();
        assert_eq!(owner.wait_notification(Duration::from_secs(5)).unwrap().imm, 7, "{tag}");
        conn.read(&h, 0, 16, OpFlags::NONE).wait().unwrap();
        conn.fetch_add(&h, 256, 3, OpFlags::NONE).wait().unwrap();
        conn.send(b"counted").wait().unwrap();
        assert_eq!(owner.recv_timeout(Duration::from_secs(5)).unwrap().data, b"counted", "{tag}");
        let s = conn.stats();
        let got = (s.writes, s.bytes_written, s.notifications_sent, s.reads, s.bytes_read, s.atomics, s.messages_sent);
        assert_eq!(got, (1, 100, 1, 1, 16, 1, 1), "{tag}: {s:?}");
        match (s.shm, s.edge) {
            (None, Some(e)) if edge => assert!(e.frames_sent > 0 && e.frames_received > 0 && e.sealed, "{s:?}"),
            (Some(_), None) if !edge => {}
            _ => panic!("{tag}: the other transport's counters: {s:?}"),
        }
    }
}
