//! The edge transport on real UDP links with faults injected on every link's send path:
//! drops, duplicates, reordering, corruption, and one link down for a while in the middle.

use rackwire_tests::{Node, TestMh};

/// MiB streamed: 32 in the suite; `RW_CHAOS_MIB=256` runs the full-size version (link 1 then
/// stays down for 2 s).
fn total_mib() -> u64 {
    std::env::var("RW_CHAOS_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(32).clamp(1, 1024)
}

// Checks that a stream of writes (32 MiB; 256 MiB with RW_CHAOS_MIB=256) over two links with
// 2% drop, 1% duplication, 1% reordering, 0.1% corruption on both nodes' links, and link 1
// down for a while in the middle of the stream, arrives byte-exact at the owner and completes.
#[test]
fn stream_survives_faults_and_a_dead_link() {
    let mib = total_mib();
    let total = mib << 20;
    let (chunk, down_ms) = if mib >= 128 { (1 << 20, 2000) } else { (256 * 1024, 1000) };
    let writes = total / chunk;
    // Pace the stream over about twice the dead link's window, so the window falls inside it.
    let gap_ms = (2 * down_ms / writes).max(1);
    let mh = TestMh::start("chaos");
    let faults = format!("drop=0.02,dup=0.01,reorder=0.01,corrupt=0.001,down=1@300+{down_ms},seed=11");
    let env = [
        (rackwire::vars::TRANSPORT, "edge"),
        (rackwire::vars::LINKS, "127.0.0.1:0,127.0.0.1:0"),
        (rackwire::vars::FAULTS, faults.as_str()),
    ];
    let mut owner = Node::spawn_env(&mh.addr, "chaos-owner", &env);
    let mut init = Node::spawn_env(&mh.addr, "chaos-init", &env);
    let a = owner.ok(&format!("alloc {total} rw"));
    let (rid, h) = a.split_once(' ').unwrap();
    owner.ok(&format!("grant {rid} {} rw", init.id));
    assert_eq!(init.ok(&format!("connect {}", owner.id)), "edge");
    let ms: u64 = init.ok(&format!("stream {h} {total} {chunk} {gap_ms} 7")).parse().unwrap();
    eprintln!("chaos: {mib} MiB in {ms} ms, link 1 down for {down_ms} ms");
    assert_eq!(owner.cmd(&format!("check-pattern {rid} 0 {total} 7")), "ok");
    let stats: serde_json::Value = serde_json::from_str(&init.ok(&format!("stats {}", owner.id))).unwrap();
    eprintln!("chaos stats: {stats}");
    assert!(stats["retransmits"].as_u64().unwrap() > 0, "faults should have cost retransmissions");
}
