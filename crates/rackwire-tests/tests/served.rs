//! Served regions (`Fabric::alloc_served`): the owner never hands the memory over, so a grant
//! holds exactly as named over shared memory as over the edge transport. Run on real
//! processes; `RW_TEST_TRANSPORT=edge` runs the same checks over the edge transport.

use rackwire_tests::{hex, Node, TestMh};

fn expect_err(n: &mut Node, cmd: &str, kind: &str) {
    let a = n.cmd(cmd);
    assert!(a.starts_with(&format!("err {kind}")), "`{cmd}` answered `{a}`, expected err {kind}");
}

/// The `mappings` count of `n`'s connection to `peer`: shared memory's counter, 0 over the
/// edge transport (which maps nothing; its counters have none).
fn mappings(n: &mut Node, peer: u32) -> u64 {
    let s = n.ok(&format!("stats {peer}"));
    let v: serde_json::Value = serde_json::from_str(&s).expect("stats are JSON");
    match v.get("mappings") {
        Some(m) => m.as_u64().expect("a mappings count"),
        None => {
            assert!(v.get("frames_sent").is_some(), "neither transport's counters: {s}");
            0
        }
    }
}

// Checks item 2 of the trust pass: on a served region a grant of WRITE lets its holder write
// but not read (over shared memory a mapped region's writer can read it all), a grant of
// ATOMIC lets its holder do atomics but not write, a grant of READ lets it read only. Each
// refusal is asked of the owner and is `ungranted`; the owner's bytes show only the allowed
// changes. The peers hold no mapping afterwards and no descriptor of the region.
#[test]
fn a_served_grant_gives_exactly_its_rights() {
    let mh = TestMh::start("served");
    let mut owner = Node::spawn(&mh.addr, "served-owner");
    let mut writer = Node::spawn(&mh.addr, "served-writer");
    let mut adder = Node::spawn(&mh.addr, "served-adder");
    let mut reader = Node::spawn(&mh.addr, "served-reader");
    let a = owner.ok("alloc-served 4096 rwa");
    let (rid, h) = a.split_once(' ').unwrap();
    owner.ok(&format!("grant {rid} {} rwa", owner.id));
    owner.ok(&format!("write {h} 0 {}", hex(b"owner-secret")));
    owner.ok(&format!("grant {rid} {} w", writer.id));
    owner.ok(&format!("grant {rid} {} a", adder.id));
    owner.ok(&format!("grant {rid} {} r", reader.id));

    // The writer writes, and cannot read what it wrote nor anything else.
    writer.ok(&format!("write {h} 100 {}", hex(b"from-writer")));
    expect_err(&mut writer, &format!("read {h} 0 12"), "ungranted");
    expect_err(&mut writer, &format!("read {h} 100 11"), "ungranted");
    expect_err(&mut writer, &format!("fadd {h} 200 1"), "ungranted");
    assert_eq!(owner.ok(&format!("local-read {rid} 100 11")), hex(b"from-writer"));

    // The adder adds; it cannot store plain bytes or read.
    assert_eq!(adder.ok(&format!("fadd {h} 200 5")), "0");
    assert_eq!(adder.ok(&format!("cas {h} 200 5 9")), "5");
    expect_err(&mut adder, &format!("write {h} 200 {}", hex(b"EVILEVIL")), "ungranted");
    expect_err(&mut adder, &format!("read {h} 0 12"), "ungranted");
    assert_eq!(owner.ok(&format!("local-load {rid} 200")), "9");

    // The reader reads; it cannot write or add.
    assert_eq!(reader.ok(&format!("read {h} 0 12")), hex(b"owner-secret"));
    expect_err(&mut reader, &format!("write {h} 0 {}", hex(b"EVIL")), "ungranted");
    expect_err(&mut reader, &format!("fadd {h} 200 1"), "ungranted");
    assert_eq!(owner.ok(&format!("local-read {rid} 0 12")), hex(b"owner-secret"));

    // Nobody mapped it; no grantee holds a descriptor of it to read it behind the fabric's back.
    for n in [&mut writer, &mut adder, &mut reader] {
        assert_eq!(mappings(n, owner.id), 0, "{} mapped a served region", n.name);
        let kept = n.cmd(&format!("keep-dup {rid}"));
        assert!(kept.contains("no descriptor"), "{} found a descriptor of the served region: {kept}", n.name);
    }
}

// Checks that operations larger than one request piece (60 KiB) arrive whole and in place:
// a 1 MiB + 3 B write of a pattern is read back byte for byte by a reader, a batch across
// pieces lands every entry, and out-of-bounds ranges are refused before anything is sent
// (the bytes there stay zero).
#[test]
fn large_operations_on_a_served_region_arrive_whole() {
    let mh = TestMh::start("served-large");
    let mut owner = Node::spawn(&mh.addr, "sl-owner");
    let mut peer = Node::spawn(&mh.addr, "sl-peer");
    let len = (1 << 20) + 3;
    let a = owner.ok(&format!("alloc-served {} rw", 2 << 20));
    let (rid, h) = a.split_once(' ').unwrap();
    owner.ok(&format!("grant {rid} {} rw", peer.id));
    peer.ok(&format!("write-len {h} 5 {len} 171"));
    let back = peer.ok(&format!("read {h} 0 {}", len + 10));
    assert_eq!(back.len(), 2 * (len + 10));
    assert_eq!(&back[..10], "0000000000", "bytes before the write are untouched");
    assert!(
        back[10..10 + 2 * len].chars().collect::<Vec<_>>().chunks(2).all(|c| c == ['a', 'b']),
        "write arrived whole"
    );
    assert_eq!(&back[10 + 2 * len..], "0000000000", "bytes after the write are untouched");
    let entries = format!("0:{},70000:{},1500000:{}", hex(b"one"), hex(&[7u8; 70_000]), hex(b"three"));
    peer.ok(&format!("batch {h} {entries}"));
    assert_eq!(owner.ok(&format!("local-read {rid} 0 3")), hex(b"one"));
    assert_eq!(owner.ok(&format!("local-read {rid} 139995 5")), hex(&[7u8; 5]));
    assert_eq!(owner.ok(&format!("local-read {rid} 1500000 5")), hex(b"three"));
    expect_err(&mut peer, &format!("write-len {h} {} 100 1", (2 << 20) - 50), "out_of_bounds");
    expect_err(&mut peer, &format!("read {h} {} 100", (2 << 20) - 50), "out_of_bounds");
    assert_eq!(owner.ok(&format!("local-read {rid} {} 50", (2 << 20) - 50)), hex(&[0u8; 50]));
}

// Checks a write with a signal on a served region: the data lands, the signal word is set or
// added (the add answers the old value), the notification the writer asked for reaches the
// owner after both; a revocation is immediate and moves nothing (`notmapped`: no peer ever
// held the memory), and the revoked peer's next write is refused `revoked`.
#[test]
fn signals_notifications_and_revocation_on_a_served_region() {
    let mh = TestMh::start("served-signal");
    let mut owner = Node::spawn(&mh.addr, "ss-owner");
    let mut peer = Node::spawn(&mh.addr, "ss-peer");
    let a = owner.ok("alloc-served 200000 rwa");
    let (rid, h) = a.split_once(' ').unwrap();
    owner.ok(&format!("grant {rid} {} rwa", peer.id));
    let big = hex(&[3u8; 100_000]);
    assert_eq!(peer.ok(&format!("wsig {h} 64 {big} 8 set 42 notify=77")), "");
    assert_eq!(owner.ok(&format!("local-load {rid} 8")), "42");
    assert_eq!(owner.ok(&format!("local-read {rid} 100060 4")), hex(&[3u8; 4]));
    assert_eq!(owner.ok("notif 2000"), format!("{} {rid} 8 8 77", peer.id));
    assert_eq!(peer.ok(&format!("wsig {h} 0 - 8 add 3")), "42");
    assert_eq!(owner.ok(&format!("local-load {rid} 8")), "45");
    assert_eq!(owner.ok(&format!("revoke {rid} {}", peer.id)), "notmapped");
    expect_err(&mut peer, &format!("write {h} 0 {}", hex(b"late")), "revoked");
    assert_eq!(owner.ok(&format!("local-read {rid} 0 4")), hex(&[0u8; 4]));
}

// Checks that pinning (lock-free stores into a mapping) is refused for a served region with
// an error that says why, while the same peer's ordinary write still goes through.
#[test]
fn a_served_region_cannot_be_pinned() {
    let (_mh, owner, peer, conn) = rackwire_tests::thread_pair("served-pin-secret", "sp-owner", "sp-peer", false);
    let region = owner.alloc_served(4096, rackwire::Access::ALL).unwrap();
    region.grant(peer.id(), rackwire::Access::ALL).unwrap();
    let h = region.handle();
    let err = conn.pin(&h, rackwire::Access::WRITE).expect_err("a served region was pinned");
    assert!(matches!(&err, rackwire::Error::Config(m) if m.contains("served")), "pinning failed with {err:?}");
    conn.write(&h, 0, b"still-fine", rackwire::OpFlags::NONE).wait().unwrap();
    assert_eq!(region.to_vec(0, 10).unwrap(), b"still-fine");
}
