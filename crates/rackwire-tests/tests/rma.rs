//! One-sided operations, messages and notifications between real processes over the
//! shared-memory transport, with every byte checked at the target.

use rackwire_tests::{hex, Node, TestMh};

fn owner_and_initiator(tag: &str) -> (TestMh, Node, Node) {
    let mh = TestMh::start(tag);
    let owner = Node::spawn(&mh.addr, &format!("{tag}-owner"));
    let init = Node::spawn(&mh.addr, &format!("{tag}-init"));
    (mh, owner, init)
}

/// Allocates a region at `owner`, grants `to` the given access, publishes it as `name`, and
/// returns (region id, handle text).
fn shared_region(owner: &mut Node, to: u32, len: u64, access: &str, name: &str) -> (u32, String) {
    let a = owner.ok(&format!("alloc {len} rwa"));
    let (id, handle) = a.split_once(' ').expect("id and handle");
    owner.ok(&format!("grant {id} {to} {access}"));
    owner.ok(&format!("publish {id} {name}"));
    (id.parse().unwrap(), handle.to_string())
}

// Checks write, read, notify and scatter-gather batch: the initiator looks the region up by
// name, writes with a notification, and the owner (another process) sees the bytes in its own
// memory and a notification naming the offset, length and immediate; the batch's three
// entries (two of them contiguous) land at their offsets; a read returns what was written.
#[test]
fn write_read_notify_and_batch_across_processes() {
    let (_mh, mut owner, mut init) = owner_and_initiator("wrnb");
    let (rid, _) = shared_region(&mut owner, init.id, 1 << 20, "rw", "wrnb-buf");
    let h = init.ok("lookup wrnb-buf");
    init.ok(&format!("write {h} 100 {} notify=77", hex(b"hello fabric")));
    let n = owner.ok("notif 5000");
    assert_eq!(n, format!("{} {rid} 100 12 77", init.id));
    assert_eq!(owner.ok(&format!("local-read {rid} 100 12")), hex(b"hello fabric"));
    assert_eq!(init.ok(&format!("read {h} 100 12")), hex(b"hello fabric"));

    init.ok(&format!("batch {h} 4096:{},4099:{},65536:{} notify=5", hex(b"abc"), hex(b"def"), hex(b"xyz")));
    // One notification, after every entry is placed, naming the last entry.
    assert_eq!(owner.ok("notif 5000"), format!("{} {rid} 65536 3 5", init.id));
    assert_eq!(owner.ok(&format!("local-read {rid} 4096 6")), hex(b"abcdef"));
    assert_eq!(owner.ok(&format!("local-read {rid} 65536 3")), hex(b"xyz"));
    // A large write crosses the copy-channel threshold and still lands exactly.
    init.ok(&format!("write-len {h} 131072 700000 171"));
    assert_eq!(owner.ok(&format!("local-read {rid} 131072 4")), "abababab");
    assert_eq!(owner.ok(&format!("local-read {rid} {} 2", 131072 + 700000 - 1)), "ab00");
}

// Checks the atomics and fences: compare-and-swap succeeds only on the expected value and
// returns the old one, fetch-and-add returns the old value and adds, and a forward-fenced
// write followed by a notifying write is seen complete by the owner when notified.
#[test]
fn atomics_and_fences_across_processes() {
    let (_mh, mut owner, mut init) = owner_and_initiator("atf");
    let (rid, _) = shared_region(&mut owner, init.id, 4096, "rwa", "atf-buf");
    let h = init.ok("lookup atf-buf");
    assert_eq!(init.ok(&format!("cas {h} 8 0 5")), "0");
    assert_eq!(init.ok(&format!("cas {h} 8 0 9")), "5", "a failed swap returns the current value");
    assert_eq!(owner.ok(&format!("local-load {rid} 8")), "5");
    assert_eq!(init.ok(&format!("fadd {h} 8 10")), "5");
    assert_eq!(owner.ok(&format!("local-load {rid} 8")), "15");

    init.ok(&format!("write {h} 1024 {} fence=after", hex(&[0xee; 64])));
    init.ok(&format!("write {h} 2048 {} fence=before notify=9", hex(b"flag")));
    assert_eq!(owner.ok("notif 5000"), format!("{} {rid} 2048 4 9", init.id));
    assert_eq!(owner.ok(&format!("local-read {rid} 1024 64")), hex(&[0xee; 64]));
}

// Checks write-with-signal: the owner finds the data and the signal word set, notified
// naming the signal word; an add yields the old value and adds; an empty write updates the
// signal alone; a misaligned signal word and data past the region's end are refused, the
// latter leaving the signal word as it was; with write access alone a set goes and an add
// (an atomic) is refused as ungranted; with atomic access alone an add without data goes.
#[test]
fn write_with_signal_sets_or_adds_after_the_data() {
    let (_mh, mut owner, mut init) = owner_and_initiator("wsig");
    let (rid, _) = shared_region(&mut owner, init.id, 4096, "rwa", "wsig-buf");
    let h = init.ok("lookup wsig-buf");
    init.ok(&format!("wsig {h} 512 {} 64 set 7 notify=3", hex(b"payload")));
    assert_eq!(owner.ok("notif 5000"), format!("{} {rid} 64 8 3", init.id));
    assert_eq!(owner.ok(&format!("local-read {rid} 512 7")), hex(b"payload"));
    assert_eq!(owner.ok(&format!("local-load {rid} 64")), "7");
    assert_eq!(init.ok(&format!("wsig {h} 520 {} 64 add 5", hex(b"more"))), "7");
    assert_eq!(owner.ok(&format!("local-load {rid} 64")), "12");
    assert_eq!(owner.ok(&format!("local-read {rid} 520 4")), hex(b"more"));
    init.ok(&format!("wsig {h} 0 - 72 set 9"));
    assert_eq!(owner.ok(&format!("local-load {rid} 72")), "9");

    let a = init.cmd(&format!("wsig {h} 0 - 68 set 1"));
    assert!(a.starts_with("err misaligned"), "misaligned signal: {a}");
    let a = init.cmd(&format!("wsig {h} 4090 {} 80 set 1", hex(&[1; 16])));
    assert!(a.starts_with("err out_of_bounds"), "data past the end: {a}");
    assert_eq!(owner.ok(&format!("local-load {rid} 80")), "0", "no signal for data never placed");

    let (wid, _) = shared_region(&mut owner, init.id, 4096, "w", "wsig-w");
    let hw = init.ok("lookup wsig-w");
    init.ok(&format!("wsig {hw} 8 {} 0 set 4", hex(b"x")));
    assert_eq!(owner.ok(&format!("local-load {wid} 0")), "4");
    let a = init.cmd(&format!("wsig {hw} 8 - 0 add 1"));
    assert!(a.starts_with("err ungranted"), "an add needs atomic access: {a}");
    assert_eq!(owner.ok(&format!("local-load {wid} 0")), "4");

    // With atomic access alone, an add without data goes (on every transport alike).
    let (aid, _) = shared_region(&mut owner, init.id, 4096, "a", "wsig-a");
    let ha = init.ok("lookup wsig-a");
    assert_eq!(init.ok(&format!("wsig {ha} 0 - 16 add 3")), "0");
    assert_eq!(owner.ok(&format!("local-load {aid} 16")), "3");
}

// Checks two-sided messages both ways, including the largest allowed message and the clear
// error for one byte more.
#[test]
fn messages_both_ways() {
    let (_mh, mut a, mut b) = owner_and_initiator("msg");
    a.ok(&format!("send {} {}", b.id, hex(b"ping")));
    assert_eq!(b.ok("recv 5000"), format!("{} {}", a.id, hex(b"ping")));
    b.ok(&format!("send {} {}", a.id, hex(b"pong")));
    assert_eq!(a.ok("recv 5000"), format!("{} {}", b.id, hex(b"pong")));
    a.ok(&format!("send-len {} {}", b.id, rackwire::MESSAGE_BYTES_MAX));
    let got = b.ok("recv 5000");
    assert_eq!(got.split_once(' ').unwrap().1.len(), 2 * rackwire::MESSAGE_BYTES_MAX);
    let too_big = a.cmd(&format!("send-len {} {}", b.id, rackwire::MESSAGE_BYTES_MAX + 1));
    assert!(too_big.starts_with("err message_too_large"), "{too_big}");
    assert!(b.cmd("recv 50").starts_with("err timeout"), "nothing else was sent");
}

// Checks that messages and notifications a peer delivered just before it left are not lost:
// the sender sends a message and writes with a notification, then quits at once (its
// connection closes); the receiver, asking only afterwards, still gets both, then times out.
#[test]
fn what_a_departed_peer_delivered_is_not_lost() {
    let (_mh, mut b, mut a) = owner_and_initiator("departed");
    let (_, h) = shared_region(&mut b, a.id, 4096, "rw", "departed-target");
    a.ok(&format!("send {} {}", b.id, hex(b"last words")));
    a.ok(&format!("write {h} 0 {} notify=9", hex(b"x")));
    a.start_cmd("quit");
    a.wait();
    // Let the sender's departure reach the receiver before it looks.
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(b.ok("recv 5000"), format!("{} {}", a.id, hex(b"last words")));
    assert!(b.ok("notif 5000").ends_with(" 9"), "the notification is there");
    assert!(b.cmd("recv 50").starts_with("err timeout"), "nothing else");
}

// Checks that two processes each doing N fetch-and-adds of 1 on one counter end at exactly 2N.
#[test]
fn two_processes_fetch_add_exactly() {
    const N: u64 = 20_000;
    let mh = TestMh::start("fadd");
    let mut owner = Node::spawn(&mh.addr, "fadd-owner");
    let mut b = Node::spawn(&mh.addr, "fadd-b");
    let mut c = Node::spawn(&mh.addr, "fadd-c");
    let (rid, h) = shared_region(&mut owner, b.id, 4096, "rwa", "fadd-ctr");
    owner.ok(&format!("grant {rid} {} rwa", c.id));
    b.start_cmd(&format!("fadd-loop {h} 0 {N}"));
    c.start_cmd(&format!("fadd-loop {h} 0 {N}"));
    assert_eq!(b.line(), "ok");
    assert_eq!(c.line(), "ok");
    assert_eq!(owner.ok(&format!("local-load {rid} 0")), (2 * N).to_string());
}

// Checks mutual exclusion built from remote compare-and-swap: four processes guard a plain
// (read, then write) counter with a CAS spin lock; with the lock, no increment is lost, so the
// counter ends at exactly 4N.
#[test]
fn four_processes_cas_lock_guard_plain_counter() {
    const N: u64 = 2_000;
    let mh = TestMh::start("lock");
    let mut owner = Node::spawn(&mh.addr, "lock-owner");
    let mut workers: Vec<Node> = (0..4).map(|i| Node::spawn(&mh.addr, &format!("lock-w{i}"))).collect();
    let a = owner.ok("alloc 4096 rwa");
    let (rid, h) = a.split_once(' ').unwrap();
    for w in &workers {
        owner.ok(&format!("grant {rid} {} rwa", w.id));
    }
    for w in workers.iter_mut() {
        w.start_cmd(&format!("lock-loop {h} 0 64 {N}"));
    }
    for w in workers.iter_mut() {
        assert_eq!(w.line(), "ok");
    }
    let bytes = owner.ok(&format!("local-read {rid} 64 8"));
    let v = u64::from_le_bytes(rackwire_mh::auth::from_hex(&bytes).unwrap().try_into().unwrap());
    assert_eq!(v, 4 * N);
    assert_eq!(owner.ok(&format!("local-load {rid} 0")), "0", "lock released");
}
