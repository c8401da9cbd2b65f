//! Access control across real processes: every refused access fails at the initiator with its
//! own error, and the target's bytes are unchanged afterwards.

use rackwire_tests::{hex, Node, TestMh, SECRET};

const CANARY: &[u8] = b"untouched-canary";

fn canary_intact(owner: &mut Node, rid: u32) {
    assert_eq!(owner.ok(&format!("local-read {rid} 0 {}", CANARY.len())), hex(CANARY), "target bytes changed");
}

fn expect_err(n: &mut Node, cmd: &str, kind: &str) {
    let a = n.cmd(cmd);
    assert!(a.starts_with(&format!("err {kind}")), "`{cmd}` answered `{a}`, expected err {kind}");
}

// Checks the four refusals the issue names, each with its own error at the initiator and the
// owner's bytes unchanged: a write without a grant (ungranted), a write after the grant was
// revoked (revoked), a write past the end (out_of_bounds), a write with a forged key (bad_key).
// Also: a read-only grant refuses writes, a misaligned atomic is refused, an unknown region id
// is refused.
#[test]
fn refused_accesses_have_distinct_errors_and_touch_nothing() {
    let mh = TestMh::start("acl");
    let mut owner = Node::spawn(&mh.addr, "acl-owner");
    let mut good = Node::spawn(&mh.addr, "acl-good");
    let mut stranger = Node::spawn(&mh.addr, "acl-stranger");
    // The owner grants itself so that `guarded` can place the canary through the fabric.
    let a = owner.ok("alloc 4096 rwa");
    let (rid, h) = a.split_once(' ').unwrap();
    let rid: u32 = rid.parse().unwrap();
    owner.ok(&format!("grant {rid} {} rwa", owner.id));
    owner.ok(&format!("write {h} 0 {}", hex(CANARY)));
    owner.ok(&format!("grant {rid} {} rwa", good.id));
    canary_intact(&mut owner, rid);

    // Ungranted.
    expect_err(&mut stranger, &format!("write {h} 0 {}", hex(b"EVIL")), "ungranted");
    expect_err(&mut stranger, &format!("read {h} 0 4"), "ungranted");
    canary_intact(&mut owner, rid);

    // Out of bounds (the granted node, straddling the end and wholly past it).
    expect_err(&mut good, &format!("write-len {h} 4090 16 69"), "out_of_bounds");
    expect_err(&mut good, &format!("write-len {h} 8192 1 69"), "out_of_bounds");
    expect_err(&mut good, &format!("batch {h} 8:{},5000:{}", hex(b"ok"), hex(b"no")), "out_of_bounds");
    canary_intact(&mut owner, rid);
    assert_eq!(
        owner.ok(&format!("local-read {rid} 8 2")),
        hex(CANARY)[16..20],
        "a refused batch writes none of its entries"
    );

    // Misaligned atomic.
    expect_err(&mut good, &format!("fadd {h} 3 1"), "misaligned");
    canary_intact(&mut owner, rid);

    // Forged key: same node and region, another key.
    let mut parts: Vec<String> = h.split(':').map(String::from).collect();
    parts[4] = format!("{:032x}", u128::from_str_radix(&parts[4], 16).unwrap() ^ 1);
    let forged = parts.join(":");
    expect_err(&mut good, &format!("write {forged} 0 {}", hex(b"EVIL")), "bad_key");
    expect_err(&mut stranger, &format!("write {forged} 0 {}", hex(b"EVIL")), "bad_key");
    canary_intact(&mut owner, rid);

    // Unknown region id.
    parts[2] = "999".into();
    expect_err(&mut good, &format!("write {} 0 00", parts.join(":")), "unknown_region");

    // Revoked: the granted node writes once (so, over shared memory, it holds a mapping),
    // then loses the grant. Over the edge transport nothing was mapped, so nothing moves.
    good.ok(&format!("write {h} 100 {}", hex(b"fine")));
    let outcome = match rackwire_tests::Transport::from_env() {
        rackwire_tests::Transport::Shm => "unmapped",
        rackwire_tests::Transport::Edge => "notmapped",
    };
    assert_eq!(owner.ok(&format!("revoke {rid} {}", good.id)), outcome);
    expect_err(&mut good, &format!("write {h} 0 {}", hex(b"EVIL")), "revoked");
    expect_err(&mut good, &format!("read {h} 0 4"), "revoked");
    canary_intact(&mut owner, rid);
    assert_eq!(owner.ok(&format!("local-read {rid} 100 4")), hex(b"fine"));

    // Read-only grant: reads work, writes and atomics are refused.
    owner.ok(&format!("grant {rid} {} r", good.id));
    assert_eq!(good.ok(&format!("read {h} 0 {}", CANARY.len())), hex(CANARY));
    expect_err(&mut good, &format!("write {h} 0 {}", hex(b"EVIL")), "ungranted");
    expect_err(&mut good, &format!("fadd {h} 0 1"), "ungranted");
    canary_intact(&mut owner, rid);

    // Granting a node the management host never admitted is refused.
    expect_err(&mut owner, &format!("grant {rid} 4242 rw"), "unknown_peer");
}

// Checks that a node with the wrong secret cannot join: the process reports `denied` and
// exits with status 2, and the management host lists no such node.
#[test]
fn wrong_secret_cannot_join() {
    let mh = TestMh::start("secret");
    let mut intruder = Node::spawn_with_secret(&mh.addr, "intruder", "not-the-secret-0123456789");
    let line = intruder.line();
    assert!(line.starts_with("join-failed denied"), "{line}");
    assert_eq!(intruder.wait().code(), Some(2));
    let nodes = mh.observer().nodes().unwrap();
    assert!(nodes.iter().all(|n| n.info.name != "intruder"));
    assert!(!SECRET.is_empty());
}

/// Every thread of process `pid` is stopped (state `T` in /proc).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.flatten().all(|t| {
        let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses and may hold spaces.
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
    })
}

// Checks revocation of a peer that does not answer: the peer process is stopped (SIGSTOP)
// after it mapped the region, so it cannot confirm the unmap (nor read its control socket);
// another granted peer meanwhile maps and writes without waiting; revoke returns `cutoff` after
// the acknowledgement timeout, and once resumed the peer finds its connection gone (within 5 s;
// none of its writes reach the owner meanwhile). The owner's bytes written before the
// revocation survive the move to fresh memory.
#[test]
fn unresponsive_peer_is_cut_off() {
    if rackwire_tests::Transport::from_env() == rackwire_tests::Transport::Edge {
        eprintln!("skipped: cutting off a peer's mapping is a shared-memory matter; the edge transport maps nothing and checks every frame");
        return;
    }
    let mh = TestMh::start("cutoff");
    let mut owner = Node::spawn(&mh.addr, "cut-owner");
    let mut peer = Node::spawn(&mh.addr, "cut-peer");
    let mut other = Node::spawn(&mh.addr, "cut-other");
    let a = owner.ok("alloc 65536 rwa");
    let (rid, h) = a.split_once(' ').unwrap();
    owner.ok(&format!("grant {rid} {} rw", peer.id));
    owner.ok(&format!("grant {rid} {} rw", other.id));
    peer.ok(&format!("write {h} 0 {}", hex(b"before")));
    let stop = std::process::Command::new("kill").args(["-STOP", &peer.pid().to_string()]).status().unwrap();
    assert!(stop.success());
    // The signal stops each thread as it next enters the kernel: wait until all have stopped,
    // or a thread still running could answer the revocation.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !all_threads_stopped(peer.pid()) {
        assert!(std::time::Instant::now() < deadline, "the peer did not stop");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let t0 = std::time::Instant::now();
    // While the owner waits for the stopped peer (which reads nothing), another granted peer
    // is not held up: it maps the region and writes at once.
    owner.start_cmd(&format!("revoke {rid} {}", peer.id));
    let t1 = std::time::Instant::now();
    other.ok(&format!("write {h} 100 {}", hex(b"other")));
    let other_took = t1.elapsed();
    let outcome = owner.line();
    let cont = std::process::Command::new("kill").args(["-CONT", &peer.pid().to_string()]).status().unwrap();
    assert!(cont.success());
    assert_eq!(outcome, "ok cutoff");
    assert!(other_took < rackwire::REVOKE_ACK_TIMEOUT / 2, "another peer waited {other_took:?} on the revocation");
    assert!(t0.elapsed() >= rackwire::REVOKE_ACK_TIMEOUT, "cut off only after the acknowledgement timeout");
    assert_eq!(owner.ok(&format!("local-read {rid} 0 6")), hex(b"before"));
    // The resumed peer learns of the cut-off from its control socket, on a thread of its own
    // that may run only after the next command: its writes may still say `ok` for a moment
    // (into the old memory), but never reach the owner, and soon fail.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let after = peer.cmd(&format!("write {h} 0 {}", hex(b"after!")));
        assert_eq!(owner.ok(&format!("local-read {rid} 0 6")), hex(b"before"), "a write after the cut-off arrived");
        if after.starts_with("err") {
            break;
        }
        assert_eq!(after, "ok");
        assert!(std::time::Instant::now() < deadline, "the peer never learnt it was cut off");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

// Checks that revocation does not take the peer's word for it: a peer that kept a duplicate
// of the region's descriptor (as a dishonest peer would) still answers the unmap request, so
// `revoke` returns `unmapped`; from then on what it writes through its duplicate never reaches
// the owner's region, and what the owner writes afterwards is not visible through it. A third
// node granted the region goes on writing it meanwhile and after (none of its writes lost).
// The stand-in for the duplicate reopens the peer's descriptor for writing, which only root
// may (the memory's file is owner-read-only).
#[test]
fn a_peer_that_kept_a_duplicate_reaches_nothing_after_revoke() {
    if rackwire_tests::Transport::from_env() == rackwire_tests::Transport::Edge {
        eprintln!("skipped: a shared-memory matter; the edge transport maps nothing and checks every frame");
        return;
    }
    if !rackwire_tests::is_root() {
        eprintln!("skipped: standing in for a kept duplicate needs root (the memory's file is owner-read-only)");
        return;
    }
    let mh = TestMh::start("dup");
    let mut owner = Node::spawn(&mh.addr, "dup-owner");
    let mut cheat = Node::spawn(&mh.addr, "dup-cheat");
    let mut other = Node::spawn(&mh.addr, "dup-other");
    let a = owner.ok("alloc 65536 rwa");
    let (rid, h) = a.split_once(' ').unwrap();
    owner.ok(&format!("grant {rid} {} rw", cheat.id));
    owner.ok(&format!("grant {rid} {} rw", other.id));
    cheat.ok(&format!("write {h} 0 {}", hex(b"mapped")));
    other.ok(&format!("write {h} 100 {}", hex(b"other-1")));
    cheat.ok(&format!("keep-dup {rid}"));
    // Before the revocation the duplicate reaches the region: the stand-in works.
    cheat.ok(&format!("dup-write {rid} 8 {}", hex(b"dup-ok")));
    assert_eq!(owner.ok(&format!("local-read {rid} 8 6")), hex(b"dup-ok"));
    assert_eq!(owner.ok(&format!("revoke {rid} {}", cheat.id)), "unmapped");
    cheat.ok(&format!("dup-write {rid} 0 {}", hex(b"EVIL!!")));
    assert_eq!(owner.ok(&format!("local-read {rid} 0 6")), hex(b"mapped"), "a kept duplicate wrote after revoke");
    other.ok(&format!("write {h} 200 {}", hex(b"other-2")));
    owner.ok(&format!("grant {rid} {} rw", owner.id));
    owner.ok(&format!("write {h} 300 {}", hex(b"secret")));
    assert_ne!(cheat.ok(&format!("dup-read {rid} 300 6")), hex(b"secret"), "a kept duplicate read after revoke");
    assert_eq!(owner.ok(&format!("local-read {rid} 100 7")), hex(b"other-1"));
    assert_eq!(owner.ok(&format!("local-read {rid} 200 7")), hex(b"other-2"));
}

// Checks a read-only grant against its own grantee, on real processes (issue: the memory's
// file mode was the only barrier, and a process of the same user may change it): the reader,
// granted `r`, maps the region by reading it, then attacks its descriptor as a process of the
// same user can — the file made writable by its owner, reopened for writing through /proc —
// and tries a writable shared mapping, a pwrite and a punched hole; each is refused (the
// memory is sealed against new writes), and the owner's bytes are unchanged. A writer granted
// `rw` that asks after the seal still gets to write (the region moves to fresh memory for it)
// and the reader, mapping again, sees its bytes.
#[test]
fn a_read_only_grant_stays_read_only_against_its_grantee() {
    if rackwire_tests::Transport::from_env() == rackwire_tests::Transport::Edge {
        eprintln!("skipped: a shared-memory matter; the edge transport maps nothing and checks every frame");
        return;
    }
    let mh = TestMh::start("ro-attack");
    let mut owner = Node::spawn(&mh.addr, "ro-owner");
    let mut reader = Node::spawn(&mh.addr, "ro-reader");
    let mut writer = Node::spawn(&mh.addr, "ro-writer");
    let a = owner.ok("alloc 65536 rwa");
    let (rid, h) = a.split_once(' ').unwrap();
    owner.ok(&format!("grant {rid} {} rw", owner.id));
    owner.ok(&format!("write {h} 0 {}", hex(b"owner's")));
    owner.ok(&format!("grant {rid} {} r", reader.id));
    owner.ok(&format!("grant {rid} {} rw", writer.id));
    assert_eq!(reader.ok(&format!("read {h} 0 7")), hex(b"owner's"));
    let attack = reader.ok(&format!("ro-attack {rid}"));
    eprintln!("the reader's attack: {attack}");
    assert!(attack.contains("reopen="), "{attack}");
    for step in ["mmap=", "pwrite=", "punch="] {
        let how = attack.split(step).nth(1).and_then(|r| r.split(' ').next()).unwrap_or("");
        assert_ne!(how, "ok", "the reader could write the region ({step}): {attack}");
    }
    assert_eq!(owner.ok(&format!("local-read {rid} 0 7")), hex(b"owner's"), "the owner's bytes changed");
    writer.ok(&format!("write {h} 16 {}", hex(b"writer")));
    assert_eq!(owner.ok(&format!("local-read {rid} 16 6")), hex(b"writer"));
    assert_eq!(reader.ok(&format!("read {h} 16 6")), hex(b"writer"), "the reader sees the writer's bytes");
    assert_eq!(reader.ok(&format!("read {h} 0 7")), hex(b"owner's"));
}
