//! The fabric around the data path: the management host going away and coming back, peers
//! going away, names that do not exist.

use std::time::{Duration, Instant};

use rackwire_tests::{hex, Node, TestMh};

// Checks management-host restart: two nodes resolve each other and exchange traffic; the
// management host stops; writes, notifications, messages and a cached lookup between them go
// on; a new name cannot be looked up meanwhile (clear error, not a hang); after a restart on
// the same state folder, the published name and both nodes are back (up again once their
// heartbeats reconnect).
#[test]
fn traffic_continues_while_management_host_is_down() {
    let mut mh = TestMh::start("mhdown");
    let mut a = Node::spawn(&mh.addr, "mhdown-a");
    let mut b = Node::spawn(&mh.addr, "mhdown-b");
    let r = a.ok("alloc 4096 rw");
    let (rid, _) = r.split_once(' ').unwrap();
    a.ok(&format!("grant {rid} {} rw", b.id));
    a.ok(&format!("publish {rid} mhdown-buf"));
    let h = b.ok("lookup mhdown-buf");
    b.ok(&format!("write {h} 0 {}", hex(b"one")));
    a.ok(&format!("send {} {}", b.id, hex(b"hi")));
    b.ok("recv 5000");

    mh.stop();
    b.ok(&format!("write {h} 0 {} notify=1", hex(b"two")));
    assert_eq!(a.ok("notif 5000"), format!("{} {rid} 0 3 1", b.id));
    assert_eq!(a.ok(&format!("local-read {rid} 0 3")), hex(b"two"));
    b.ok(&format!("send {} {}", a.id, hex(b"still here")));
    assert_eq!(a.ok("recv 5000"), format!("{} {}", b.id, hex(b"still here")));
    assert_eq!(b.ok("lookup mhdown-buf"), h, "cached lookup answers while the host is down");
    let missing = b.cmd("lookup never-published");
    assert!(missing.starts_with("err mh"), "{missing}");

    mh.restart();
    let obs = mh.observer();
    assert_eq!(obs.lookup("mhdown-buf").unwrap().region.to_string(), rid);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let nodes = obs.nodes().unwrap();
        let up = nodes.iter().filter(|n| n.up && n.info.name.starts_with("mhdown-")).count();
        if up == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "nodes did not come back: {nodes:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    b.ok(&format!("write {h} 0 {}", hex(b"three")));
    assert_eq!(a.ok(&format!("local-read {rid} 0 5")), hex(b"three"));
}

// Checks that a peer that dies is reported as gone, not waited on: after the owner process is
// killed, the initiator's operations on its region fail with peer_gone within a bounded time.
#[test]
fn dead_peer_is_reported_gone() {
    let mh = TestMh::start("gone");
    let mut owner = Node::spawn(&mh.addr, "gone-owner");
    let mut init = Node::spawn(&mh.addr, "gone-init");
    let r = owner.ok("alloc 4096 rw");
    let (rid, h) = r.split_once(' ').unwrap();
    owner.ok(&format!("grant {rid} {} rw", init.id));
    init.ok(&format!("write {h} 0 {}", hex(b"alive")));
    owner.kill();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let a = init.cmd(&format!("write {h} 0 {}", hex(b"again")));
        if a.starts_with("err peer_gone") {
            break;
        }
        assert!(a == "ok" && Instant::now() < deadline, "unexpected answer {a}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let send = init.cmd(&format!("send {} 00", owner.id));
    assert!(send.starts_with("err"), "{send}");
}

// Checks the unknown-peer error: connecting to a node id the management host never gave out.
#[test]
fn unknown_peer_is_refused() {
    let mh = TestMh::start("unknown");
    let mut a = Node::spawn(&mh.addr, "unknown-a");
    let ans = a.cmd("connect 777");
    assert!(ans.starts_with("err unknown_peer"), "{ans}");
    let ans = a.cmd(&format!("write rw1:777:1:4096:{} 0 00", "0".repeat(32)));
    assert!(ans.starts_with("err unknown_peer"), "{ans}");
}

// Checks that two nodes whose links carry different frame sizes (one 8972 bytes, the other
// 1472) agree on the smaller one in the handshake: both report 1472 as the connection's
// largest frame (without the agreement the large side reports 8972 and sends frames a real
// 1500-byte link cannot carry whole); a stream of writes from the small side, a read answered
// by the large side, and a message from the large side all arrive byte-exact.
#[test]
fn nodes_with_different_link_mtus_use_the_smaller() {
    let mh = TestMh::start("mtu");
    let links = (rackwire::vars::LINKS, "127.0.0.1:0,127.0.0.1:0");
    let big = [(rackwire::vars::TRANSPORT, "edge"), links, (rackwire::vars::LINK_MTU, "8972")];
    let small = [(rackwire::vars::TRANSPORT, "edge"), links, (rackwire::vars::LINK_MTU, "1472")];
    let mut owner = Node::spawn_env(&mh.addr, "mtu-big", &big);
    let mut init = Node::spawn_env(&mh.addr, "mtu-small", &small);
    let total: u64 = 4 << 20;
    let a = owner.ok(&format!("alloc {total} rw"));
    let (rid, h) = a.split_once(' ').unwrap();
    owner.ok(&format!("grant {rid} {} rw", init.id));
    assert_eq!(init.ok(&format!("connect {}", owner.id)), "edge");
    init.ok(&format!("stream {h} {total} 262144 0 5"));
    let (owner_id, init_id) = (owner.id, init.id);
    for (n, peer) in [(&mut init, owner_id), (&mut owner, init_id)] {
        let stats: serde_json::Value = serde_json::from_str(&n.ok(&format!("stats {peer}"))).unwrap();
        assert_eq!(stats["frame_max"], 1472, "{}: {stats}", n.name);
    }
    assert_eq!(owner.cmd(&format!("check-pattern {rid} 0 {total} 5")), "ok");
    let (off, len) = (100_000u64, 60_000usize);
    assert_eq!(init.ok(&format!("read {h} {off} {len}")), hex(&rackwire_tests::pattern(5, off, len)));
    owner.ok(&format!("send-len {} 50000", init.id));
    assert_eq!(init.ok("recv 10000"), format!("{} {}", owner.id, hex(&[7u8; 50000])));
}

// Checks that a node that crashed and comes straight back (same name, same key, so the same
// id) reaches its peer over the edge transport at once: its first handshake frame must open a
// new connection at the peer, not find the peer's connection to its dead predecessor (which
// lingers until that is found gone). Bounded: the write after the restart must succeed within
// a second of the new node joining.
#[test]
fn a_node_that_restarts_at_once_reconnects_at_once() {
    let mh = TestMh::start("restart");
    let edge = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "127.0.0.1:0,127.0.0.1:0")];
    let mut owner = Node::spawn_env(&mh.addr, "restart-owner", &edge);
    let a = owner.ok("alloc 4096 rw");
    let (rid, h) = a.split_once(' ').unwrap();
    let mut bee = Node::spawn_env(&mh.addr, "restart-bee", &edge);
    owner.ok(&format!("grant {rid} {} rw", bee.id));
    bee.ok(&format!("write {h} 0 {}", hex(b"before")));
    let id = bee.id;
    bee.kill();
    let mut bee = Node::spawn_env(&mh.addr, "restart-bee", &edge);
    assert_eq!(bee.id, id, "the same key keeps its id");
    let t0 = Instant::now();
    bee.ok(&format!("write {h} 0 {}", hex(b"after!")));
    let took = t0.elapsed();
    assert_eq!(owner.ok(&format!("local-read {rid} 0 6")), hex(b"after!"));
    assert!(took < Duration::from_secs(1), "the restarted node took {took:?} to reach its peer");
}
