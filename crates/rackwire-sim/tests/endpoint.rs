//! The endpoint: frames routed to their connection by the id in their header, and a
//! connection opened once per peer's first handshake frame.

use rackwire_proto::{
    Completion, Config, Connection, Endpoint, Happened, Incoming, OpError, OpFlags, RegionRef, Routed, State, Time,
    HANDSHAKES_ACCEPTED_MAX,
};
use rackwire_sim::world::SimEndpoint;
use rackwire_sim::{keys, MemTarget};

const MTU: usize = 1472;
const SECRET: &[u8] = b"endpoint-test-secret";

/// A node: its endpoint and its memory.
struct Node {
    id: u32,
    ep: SimEndpoint,
    mem: MemTarget,
}

impl Node {
    fn new(id: u32, links: usize) -> Node {
        Node { id, ep: Endpoint::new(id, links), mem: MemTarget::default() }
    }

    fn accept(id: u32) -> impl FnOnce(u32, Incoming) -> Option<Connection> {
        move |local, i| {
            let creds = keys::credentials(id, SECRET);
            Some(Connection::accept(
                Config::new(i.links, MTU),
                id,
                &creds,
                i.peer,
                keys::public_key(i.peer),
                [9; 32],
                local,
                0,
            ))
        }
    }

    /// Open a connection to node `to`, at address `to` on each of `links` links.
    fn open(&mut self, to: u32, links: usize) -> u32 {
        self.open_with_nonce(to, links, [1; 32])
    }

    fn open_with_nonce(&mut self, to: u32, links: usize, nonce: [u8; 32]) -> u32 {
        let creds = keys::credentials(self.id, SECRET);
        let me = self.id;
        self.ep
            .open(to, vec![Some(to as usize); links], |local| {
                Connection::connect(Config::new(links, MTU), me, to, &creds, keys::public_key(to), nonce, local, 0)
            })
            .unwrap()
    }

    /// What the endpoint hands over now, with each connection's local id.
    fn happened(&mut self) -> Vec<(u32, Happened<u32>)> {
        let mut out = Vec::new();
        self.ep.poll(None, |local, _, h| out.push((local, h)));
        out
    }

    /// Hand a frame to this node; where it went.
    fn take(&mut self, now: Time, link: usize, from: u32, frame: &[u8]) -> Routed {
        self.ep.handle(now, link, from as usize, frame, &mut self.mem, Node::accept(self.id))
    }

    /// Every frame this node's connections send now, with the address each goes to.
    fn out(&mut self, now: Time) -> Vec<(u32, usize, Vec<u8>)> {
        let mut buf = vec![0u8; 65536];
        let mut out = Vec::new();
        for s in self.ep.sessions_mut() {
            while let Some(t) = s.conn_mut().poll_transmit(now, &mut buf) {
                if let Some(to) = s.addr(t.link) {
                    out.push((to as u32, t.link, buf[..t.len].to_vec()));
                }
            }
        }
        out
    }
}

/// Move frames between the nodes until quiet; every frame's routing outcome, in order.
fn run(nodes: &mut [Node], now: &mut Time) -> Vec<Routed> {
    let mut routed = Vec::new();
    for _ in 0..100 {
        let mut moved = false;
        for i in 0..nodes.len() {
            let from = nodes[i].id;
            for (to, link, frame) in nodes[i].out(*now) {
                if let Some(n) = nodes.iter_mut().find(|n| n.id == to) {
                    routed.push(n.take(*now + 10, link, from, &frame));
                    moved = true;
                }
            }
        }
        *now += 10;
        if !moved {
            break;
        }
    }
    routed
}

// Checks routing and accepting end to end: node 1 opens a connection to node 2 through its
// endpoint; node 2's endpoint opens exactly one connection for it on the first handshake
// frame (a repeat of that frame, as a peer retrying sends it, reaches the same connection),
// both ends get established, and a write lands in node 2's memory through the routed frames.
#[test]
fn a_first_handshake_opens_one_connection_and_frames_find_it() {
    let mut nodes = [Node::new(1, 2), Node::new(2, 2)];
    nodes[1].mem.add_region(5, 55, 4096, &[1]);
    let local = nodes[0].open(2, 2);
    // The first frame, kept to be sent again later.
    let first = nodes[0].out(0);
    assert_eq!(first.len(), 1, "one hello");
    let (_, link, hello) = first[0].clone();
    let r = nodes[1].take(10, link, 1, &hello);
    let Routed::Accepted(theirs) = r else { panic!("the first hello opens a connection: {r:?}") };
    assert_eq!(nodes[1].take(20, link, 1, &hello), Routed::Conn(theirs), "a repeated hello finds it");
    let mut now = 30;
    run(&mut nodes, &mut now);
    assert_eq!(nodes[1].ep.len(), 1, "one connection at the acceptor");
    assert_eq!(nodes[0].ep.get(local).unwrap().conn().state(), State::Established);
    assert_eq!(nodes[1].ep.get(theirs).unwrap().conn().state(), State::Established);
    let target = RegionRef { region: 5, key: 55 };
    let id = nodes[0].ep.submit(local, |id| id + 1000, |c| c.write(now, target, 100, b"routed", OpFlags::default()));
    let id = id.unwrap();
    assert_eq!(nodes[0].ep.get(local).unwrap().pending(), 1);
    let routed = run(&mut nodes, &mut now);
    assert!(routed.iter().all(|r| matches!(r, Routed::Conn(_))), "established traffic is routed: {routed:?}");
    assert_eq!(&nodes[1].mem.regions[&5].data[100..106], b"routed");
    // The completion comes back once, with what was kept for the operation.
    let done: Vec<_> =
        nodes[0].happened().into_iter().filter(|(_, h)| matches!(h, Happened::Completed { .. })).collect();
    assert_eq!(done, vec![(local, Happened::Completed { op: id + 1000, result: Ok(Completion::Done) })]);
    assert_eq!(nodes[0].ep.get(local).unwrap().pending(), 0);
}

/// Two nodes connected through their endpoints, node 2 with a region node 1 may write.
fn connected() -> ([Node; 2], u32, Time) {
    let mut nodes = [Node::new(1, 1), Node::new(2, 1)];
    nodes[1].mem.add_region(5, 55, 4096, &[1]);
    let local = nodes[0].open(2, 1);
    let mut now = 0;
    run(&mut nodes, &mut now);
    assert_eq!(nodes[0].ep.get(local).unwrap().conn().state(), State::Established);
    for n in &mut nodes {
        n.happened();
    }
    (nodes, local, now)
}

// Checks the endpoint's pending operations when a connection ends: operations still in flight
// are handed back exactly once, failed with `Closed`, before the connection's own `Closed`;
// the endpoint refuses later submissions on it; the peer is told.
#[test]
fn a_closed_connection_hands_back_its_pending_operations_once() {
    let (mut nodes, local, mut now) = connected();
    let target = RegionRef { region: 5, key: 55 };
    for k in 0..3u32 {
        nodes[0].ep.submit(local, |_| k, |c| c.write(now, target, 0, &[7; 64], OpFlags::default())).unwrap();
    }
    nodes[0].ep.get_mut(local).unwrap().conn_mut().close(now);
    let got = nodes[0].happened();
    let mut failed: Vec<u32> = got
        .iter()
        .filter_map(|(_, h)| match h {
            Happened::Completed { op, result: Err(OpError::Closed) } => Some(*op),
            _ => None,
        })
        .collect();
    failed.sort_unstable();
    assert_eq!(failed, vec![0, 1, 2], "{got:?}");
    assert!(matches!(got.last(), Some((_, Happened::Closed(_)))), "closed comes last: {got:?}");
    assert!(nodes[0].ep.get(local).unwrap().is_closed() && nodes[0].ep.get(local).unwrap().pending() == 0);
    let again = nodes[0].ep.submit(local, |_| 9, |c| c.write(now, target, 0, &[1], OpFlags::default()));
    assert_eq!(again, Err(OpError::Closed));
    assert_eq!(
        nodes[0].ep.submit(777, |_| 9, |c| c.write(now, target, 0, &[1], OpFlags::default())),
        Err(OpError::Closed)
    );
    run(&mut nodes, &mut now);
    assert!(nodes[1].happened().iter().any(|(_, h)| matches!(h, Happened::Closed(_))), "the peer is told");
}

// Checks delivery room and answer holding through the endpoint: with bounds, a message waits
// in the connection's queue (not handed over as it comes) until taken; a connection that
// delivered while a hold was asked for sends nothing (its acknowledgement waits for a reply to
// ride with) until the hold is released, and then answers.
#[test]
fn delivered_messages_wait_in_bounds_and_answers_are_held_until_released() {
    let (mut nodes, local, mut now) = connected();
    nodes[1].ep.set_delivery_room(4096, 4);
    nodes[0].ep.submit(local, |_| 1, |c| c.send(now, b"ping", OpFlags::default())).unwrap();
    for (to, link, frame) in nodes[0].out(now) {
        assert_eq!(to, 2);
        nodes[1].take(now + 5, link, 1, &frame);
    }
    now += 10;
    let mut handed = Vec::new();
    let delivered = nodes[1].ep.poll(Some(now + 1_000), |_, _, h| handed.push(h)).delivered;
    assert!(delivered && handed.is_empty(), "bounded: the message waits in its queue: {handed:?}");
    assert!(nodes[1].out(now).is_empty(), "held: no lone acknowledgement goes back");
    assert!(nodes[1].ep.release_holds(), "a hold was on");
    assert!(!nodes[1].ep.release_holds(), "released once");
    let theirs = nodes[1].ep.sessions().next().map(|s| s.conn().state());
    assert_eq!(theirs, Some(State::Established));
    let s = nodes[1].ep.sessions_mut().next().unwrap();
    assert_eq!(s.next_message().as_deref(), Some(&b"ping"[..]));
    assert!(s.nothing_to_take());
    // Released: the acknowledgement goes now or at its timer (a delayed ack).
    let mut acked = !nodes[1].out(now).is_empty();
    for _ in 0..100 {
        if acked {
            break;
        }
        now = nodes[1].ep.next_timeout().unwrap_or(now + 1_000).max(now + 1);
        nodes[1].ep.handle_timeouts(now, &mut MemTarget::default());
        acked = !nodes[1].out(now).is_empty();
    }
    assert!(acked, "the answer goes once the hold is released");
}

// Checks that a landed signal counts as a delivery for holding: an ordered write (a
// signal) placed at node 2 makes the endpoint's poll say so (and not that a message or
// notification was delivered), holds the answer it owes (nothing goes back alone), and the
// signal is said once; released, the answer goes.
#[test]
fn a_landed_signal_holds_answers_like_a_delivery() {
    let (mut nodes, local, mut now) = connected();
    let target = RegionRef { region: 5, key: 55 };
    let ordered = OpFlags { ordered: true, ..OpFlags::default() };
    nodes[0].ep.submit(local, |_| 1, |c| c.write(now, target, 8, &7u64.to_le_bytes(), ordered)).unwrap();
    for (_, link, frame) in nodes[0].out(now) {
        nodes[1].take(now + 5, link, 1, &frame);
    }
    now += 10;
    assert_eq!(nodes[1].mem.regions[&5].data[8], 7, "the signal is in place");
    let polled = nodes[1].ep.poll(Some(now + 1_000), |_, _, _| {});
    assert!(polled.signalled && !polled.delivered, "{polled:?}");
    assert!(nodes[1].out(now).is_empty(), "held: the answer waits for a reply to ride in");
    assert!(!nodes[1].ep.poll(Some(now + 1_000), |_, _, _| {}).signalled, "said once");
    assert!(nodes[1].ep.release_holds());
    assert!(!nodes[1].out(now).is_empty(), "released, the answer goes");
}

// Checks what the endpoint drops without opening anything: a hello addressed to another
// node, a hello on a link the sender does not have, a frame for a connection id this node
// never gave out, and bytes too short to be a frame.
#[test]
fn frames_for_no_connection_of_this_node_are_dropped() {
    let mut three = Node::new(3, 2);
    let mut one = Node::new(1, 2);
    one.open(2, 1);
    let (_, link, hello_to_2) = one.out(0).remove(0);
    assert_eq!(three.take(10, link, 1, &hello_to_2), Routed::Dropped, "a hello for node 2");
    // Node 2 has two links, the sender one: a hello on link 1 is refused.
    let mut two = Node::new(2, 2);
    assert_eq!(two.take(10, 1, 1, &hello_to_2), Routed::Dropped, "a hello on a link the peer lacks");
    assert!(two.ep.is_empty() && three.ep.is_empty());
    // Established traffic to a connection id that node 2 never gave out.
    assert!(matches!(two.take(20, 0, 1, &hello_to_2), Routed::Accepted(_)));
    let mut now = 30;
    let mut nodes = [one, two];
    run(&mut nodes, &mut now);
    let data = nodes[0].out(now);
    assert!(data.is_empty(), "quiet after the handshake");
    let mut forged = hello_to_2.clone();
    let mut f = rackwire_wire::Frame::new_unchecked(&mut forged[..]);
    f.set_conn(4242);
    f.fill_checksums();
    assert_eq!(nodes[1].take(now, 0, 1, &forged), Routed::Dropped, "an unknown connection id");
    assert_eq!(nodes[1].take(now, 0, 1, &[0u8; 5]), Routed::Dropped, "too short for a frame");
    assert_eq!(nodes[1].ep.len(), 1);
}

// Checks that a peer that restarted and chose the same connection id is not mistaken for a
// repeat: its first frame carries a new nonce, so the acceptor opens a new connection (which
// gets established and carries a write) instead of routing it to the old one.
#[test]
fn a_restarted_peer_with_the_same_connection_id_gets_a_new_connection() {
    let (mut nodes, _, mut now) = connected();
    let old = nodes[1].ep.sessions().next().map(|s| s.conn().peer_nonce()).unwrap();
    // Node 1 restarts: a new endpoint, whose first connection gets the same id.
    nodes[0] = Node::new(1, 1);
    let local = nodes[0].open_with_nonce(2, 1, [7; 32]);
    let hello = nodes[0].out(now).remove(0);
    let r = nodes[1].take(now, hello.1, 1, &hello.2);
    assert!(matches!(r, Routed::Accepted(_)), "a new incarnation opens a connection: {r:?}");
    assert_eq!(nodes[1].ep.len(), 2);
    run(&mut nodes, &mut now);
    assert_eq!(nodes[0].ep.get(local).unwrap().conn().state(), State::Established);
    assert_ne!(old, [7; 32]);
    let target = RegionRef { region: 5, key: 55 };
    nodes[0].ep.submit(local, |_| 1, |c| c.write(now, target, 0, b"again", OpFlags::default())).unwrap();
    run(&mut nodes, &mut now);
    assert_eq!(&nodes[1].mem.regions[&5].data[0..5], b"again");
}

// Checks that first frames alone (as from spoofed sources, each naming a node the acceptor
// knows, never answering) hold a bounded number of slots: after twice the limit of such
// frames from distinct callers, node 2 keeps at most HANDSHAKES_ACCEPTED_MAX connections, the
// newest; a connection that finished its handshake is not among those that go.
#[test]
fn first_frames_alone_hold_a_bounded_number_of_slots() {
    let (mut nodes, _, now) = connected();
    assert_eq!(nodes[1].ep.len(), 1, "the established connection");
    let callers = 2 * HANDSHAKES_ACCEPTED_MAX as u32;
    let mut last = None;
    for id in 100..100 + callers {
        let mut caller = Node::new(id, 1);
        caller.open(2, 1);
        let (_, link, hello) = caller.out(now).remove(0);
        last = Some(nodes[1].take(now, link, id, &hello));
    }
    assert!(matches!(last, Some(Routed::Accepted(_))), "the newest is taken: {last:?}");
    assert_eq!(nodes[1].ep.len(), 1 + HANDSHAKES_ACCEPTED_MAX, "{} connections", nodes[1].ep.len());
    let established = nodes[1].ep.sessions().filter(|s| s.conn().state() == State::Established).count();
    assert_eq!(established, 1, "the established connection stays");
}

// Checks that only a frame that proves its sender moves a peer's address (issue: one forged
// 32-byte frame with a live connection id, sent in clear, redirected a link): at node 2, an
// unsealed frame and a sealed frame with a made-up tag, both carrying node 2's id for the
// connection, come from address 99; node 2 still sends to node 1's address (99 gets nothing)
// and a write from node 2 lands at node 1. A genuine frame from node 1 that comes from a new
// address (the peer moved) does move it.
#[test]
fn only_a_proven_frame_moves_a_peers_address() {
    let (mut nodes, local, mut now) = connected();
    nodes[0].mem.add_region(6, 66, 4096, &[2]);
    let theirs = nodes[1].ep.iter_mut().next().map(|(l, _)| l).unwrap();
    assert_eq!(nodes[1].ep.get(theirs).unwrap().addr(0), Some(1));
    // A genuine sealed frame from node 1, to forge from.
    nodes[0].ep.submit(local, |_| 1, |c| c.send(now, b"ping", OpFlags::default())).unwrap();
    let (_, link, genuine) = nodes[0].out(now).remove(0);
    let mut bad_tag = genuine.clone();
    let last = bad_tag.len() - 1;
    bad_tag[last] ^= 1;
    let mut plain = genuine.clone();
    plain.truncate(rackwire_wire::HEADER_LEN);
    let repr = rackwire_wire::FrameRepr {
        kind: rackwire_wire::FrameKind::Ack,
        link: 0,
        conn: theirs,
        seq: 0,
        ack: None,
        ts: 0,
        payload_len: 0,
    };
    repr.emit(&mut plain).fill_checksums();
    for forged in [&plain, &bad_tag] {
        nodes[1].take(now, link, 99, forged);
        assert_eq!(nodes[1].ep.get(theirs).unwrap().addr(0), Some(1), "a forged frame moved the address");
    }
    let target = RegionRef { region: 6, key: 66 };
    nodes[1].ep.submit(theirs, |_| 2, |c| c.write(now, target, 0, b"back", OpFlags::default())).unwrap();
    let out = nodes[1].out(now);
    assert!(!out.is_empty() && out.iter().all(|(to, _, _)| *to == 1), "node 2 sends to node 1 only: {out:?}");
    for (_, l, f) in out {
        nodes[0].take(now + 5, l, 2, &f);
    }
    run(&mut nodes, &mut now);
    assert_eq!(&nodes[0].mem.regions[&6].data[..4], b"back", "the write lands");
    // A genuine frame from a new address: the peer is there now.
    nodes[0].ep.submit(local, |_| 3, |c| c.send(now, b"moved", OpFlags::default())).unwrap();
    let (_, link, genuine) = nodes[0].out(now).remove(0);
    nodes[1].take(now, link, 7, &genuine);
    assert_eq!(nodes[1].ep.get(theirs).unwrap().addr(0), Some(7), "a genuine frame moves it");
}

// Checks the stateless retry (issue: first frames naming real node ids, from spoofed sources,
// each cost the acceptor a key exchange and a signature and a slot): node 2 has a retry key
// and HANDSHAKES_BEFORE_RETRY handshakes under way from spoofed sources (addresses 100 on,
// never answering); node 1's first Hello then opens nothing — node 2 queues a Retry to
// address 1 instead, keeping no connection for it. Given the Retry, node 1 sends its Hello
// again with the token and node 2 opens the connection; the two get established and a write
// lands. The same token from another address (99) opens nothing (a Retry again).
#[test]
fn under_load_a_first_frame_opens_a_connection_only_with_a_retry_token() {
    use rackwire_proto::HANDSHAKES_BEFORE_RETRY;
    let mut nodes = [Node::new(1, 1), Node::new(2, 1)];
    nodes[1].mem.add_region(5, 55, 4096, &[1]);
    nodes[1].ep.set_retry_key([42; 32]);
    // Spoofed callers: nodes 10.. (keys the acceptor knows), from addresses 100.., silent after.
    for k in 0..HANDSHAKES_BEFORE_RETRY as u32 {
        let mut spoof = Node::new(10 + k, 1);
        spoof.open(2, 1);
        let (_, l, hello) = spoof.out(0).remove(0);
        assert!(matches!(nodes[1].take(0, l, 100 + k, &hello), Routed::Accepted(_)));
    }
    let busy = nodes[1].ep.len();
    let local = nodes[0].open(2, 1);
    let (_, l, hello) = nodes[0].out(10).remove(0);
    assert_eq!(nodes[1].take(20, l, 1, &hello), Routed::Dropped, "no connection without a token");
    assert_eq!(nodes[1].ep.len(), busy, "nothing kept for it");
    let (to, rl, retry) = nodes[1].ep.next_retry().expect("a Retry is queued");
    assert_eq!((to, rl), (1, l));
    assert_eq!(nodes[1].ep.retries_sent(), 1);
    nodes[0].take(30, rl, 2, &retry);
    let again = nodes[0].out(40);
    assert_eq!(again.len(), 1, "the Hello goes again at once");
    assert_eq!(nodes[0].ep.get(local).unwrap().conn().stats().retries, 1);
    let (_, l2, with_token) = again[0].clone();
    // The token is bound to the address: from 99 it opens nothing.
    assert_eq!(nodes[1].take(50, l2, 99, &with_token), Routed::Dropped);
    assert!(nodes[1].ep.next_retry().is_some_and(|(to, _, _)| to == 99));
    assert!(matches!(nodes[1].take(60, l2, 1, &with_token), Routed::Accepted(_)), "the token opens it");
    let mut now = 70;
    run(&mut nodes, &mut now);
    assert_eq!(nodes[0].ep.get(local).unwrap().conn().state(), State::Established);
    let target = RegionRef { region: 5, key: 55 };
    nodes[0].ep.submit(local, |_| 1, |c| c.write(now, target, 0, b"retried", OpFlags::default())).unwrap();
    run(&mut nodes, &mut now);
    assert_eq!(&nodes[1].mem.regions[&5].data[..7], b"retried");
}
