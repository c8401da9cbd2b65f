//! The endpoint: frames routed to their connection by the id in their header, and a
//! connection opened once per peer's first handshake frame.

use rackwire_proto::{Config, Connection, Endpoint, Event, Incoming, OpFlags, RegionRef, Routed, State, Time};
use rackwire_sim::pair::events;
use rackwire_sim::world::SimConn;
use rackwire_sim::{keys, MemTarget};

const MTU: usize = 1472;
const SECRET: &[u8] = b"endpoint-test-secret";

/// A node: its endpoint and its memory.
struct Node {
    id: u32,
    ep: Endpoint<SimConn>,
    mem: MemTarget,
}

impl Node {
    fn new(id: u32, links: usize) -> Node {
        Node { id, ep: Endpoint::new(id, links), mem: MemTarget::default() }
    }

    fn accept(id: u32) -> impl FnOnce(u32, Incoming) -> Option<SimConn> {
        move |local, i| {
            let creds = keys::credentials(id, SECRET);
            let conn = Connection::accept(
                Config::new(i.links, MTU),
                id,
                &creds,
                i.peer,
                keys::public_key(i.peer),
                [9; 32],
                local,
                0,
            );
            Some(SimConn::new(conn, i.peer as usize, vec![None; i.links]))
        }
    }

    /// Hand a frame to this node; where it went.
    fn take(&mut self, now: Time, link: usize, from: u32, frame: &[u8]) -> Routed {
        self.ep.handle(now, link, from as usize, frame, &mut self.mem, Node::accept(self.id))
    }

    /// Every frame this node's connections send now, with the address each goes to.
    fn out(&mut self, now: Time) -> Vec<(u32, usize, Vec<u8>)> {
        let mut buf = vec![0u8; 65536];
        let mut out = Vec::new();
        for s in self.ep.slots_mut() {
            while let Some(t) = s.conn.poll_transmit(now, &mut buf) {
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
    let local = nodes[0]
        .ep
        .open(|local| {
            SimConn::new(
                Connection::connect(
                    Config::new(2, MTU),
                    1,
                    2,
                    &keys::credentials(1, SECRET),
                    keys::public_key(2),
                    [1; 32],
                    local,
                    0,
                ),
                2,
                vec![Some(2); 2],
            )
        })
        .unwrap();
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
    assert_eq!(nodes[0].ep.get_mut(local).unwrap().conn.state(), State::Established);
    assert_eq!(nodes[1].ep.get_mut(theirs).unwrap().conn.state(), State::Established);
    let c = &mut nodes[0].ep.get_mut(local).unwrap().conn;
    c.write(now, RegionRef { region: 5, key: 55 }, 100, b"routed", OpFlags::default()).unwrap();
    let routed = run(&mut nodes, &mut now);
    assert!(routed.iter().all(|r| matches!(r, Routed::Conn(_))), "established traffic is routed: {routed:?}");
    assert_eq!(&nodes[1].mem.regions[&5].data[100..106], b"routed");
    let done = events(&mut nodes[0].ep.get_mut(local).unwrap().conn);
    assert!(done.iter().any(|e| matches!(e, Event::Completed { result: Ok(_), .. })), "{done:?}");
}

// Checks what the endpoint drops without opening anything: a hello addressed to another
// node, a hello on a link the sender does not have, a frame for a connection id this node
// never gave out, and bytes too short to be a frame.
#[test]
fn frames_for_no_connection_of_this_node_are_dropped() {
    let mut three = Node::new(3, 2);
    let mut one = Node::new(1, 2);
    one.ep.open(|local| {
        SimConn::new(
            Connection::connect(
                Config::new(1, MTU),
                1,
                2,
                &keys::credentials(1, SECRET),
                keys::public_key(2),
                [1; 32],
                local,
                0,
            ),
            2,
            vec![Some(2)],
        )
    });
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
