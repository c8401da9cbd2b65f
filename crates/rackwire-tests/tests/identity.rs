//! Node identity, as a user meets it: a name belongs to the key it first joined with, a node
//! that restarts with its key keeps its id and the grants made to it, and a process that holds
//! the fabric secret cannot pass for another node on either transport, nor slip frames into
//! another node's edge connection.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rackwire::{Access, Error, Fabric, FabricConfig, OpFlags, TransportChoice};
use rackwire_mh::auth::{from_hex, to_hex};
use rackwire_mh::identity::{public_from_hex, Identity};
use rackwire_mh::{MhClient, MhConfig, NodeInfo, Role};
use rackwire_proto::{CloseReason, Config, Connection, Credentials, OpFlags as ProtoFlags, RegionRef, State};
use rackwire_sim::MemTarget;
use rackwire_tests::{TempDir, TestMh, SECRET};

/// A node called `name` keeping its key in `state`; over the edge transport on a loopback
/// link with `edge`.
fn node(mh: &str, name: &str, state: &TempDir, edge: bool) -> Result<Fabric, Error> {
    let mut cfg = FabricConfig::new(mh, SECRET, name);
    cfg.state_dir = Some(state.0.clone());
    if edge {
        cfg.transport = TransportChoice::Edge;
        cfg.links = vec!["127.0.0.1:0".into()];
    }
    Fabric::join(cfg)
}

/// Join, retrying while the management host still sees the name's previous session as live.
fn rejoin(mh: &str, name: &str, state: &TempDir, edge: bool) -> Fabric {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match node(mh, name, state, edge) {
            Ok(f) => return f,
            Err(e) if Instant::now() < deadline && e.to_string().contains("in use") => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("rejoin {name}: {e}"),
        }
    }
}

fn observer(mh: &str) -> MhClient {
    MhClient::join(MhConfig {
        addr: mh.into(),
        secret: SECRET.into(),
        name: "obs".into(),
        role: Role::Observer,
        trust: rackwire_mh::MhTrust::Secret,
        transient: false,
    })
    .expect("observer joins")
}

fn zeros(f: &rackwire::Region, len: usize) -> bool {
    let mut b = vec![1u8; len];
    f.read_at(0, &mut b).unwrap();
    b.iter().all(|&x| x == 0)
}

// Checks, on each transport: a node granted write access writes; after it leaves, a process
// with the fabric secret but another key cannot join under its name (refused by the
// management host, naming the reason) and the owner's memory is untouched; the node itself,
// restarting with the key in its state folder, gets its old id back and writes again under
// the grant made before, with no new grant.
#[test]
fn a_departed_nodes_name_is_refused_to_another_key_and_kept_for_its_own() {
    for edge in [false, true] {
        let mh = TestMh::start("identity-name");
        let (sa, sb, sx) = (TempDir::new("owner"), TempDir::new("bee"), TempDir::new("impostor"));
        let owner = node(&mh.addr, "owner", &sa, edge).unwrap();
        let region = owner.alloc(4096, Access::ALL).unwrap();
        let bee = node(&mh.addr, "bee", &sb, edge).unwrap();
        let bee_id = bee.id();
        region.grant(bee_id, Access::WRITE).unwrap();
        bee.connect(owner.id()).unwrap().write(&region.handle(), 0, &[0x11; 64], OpFlags::default()).wait().unwrap();
        drop(bee);
        match node(&mh.addr, "bee", &sx, edge) {
            Err(Error::Mh(m)) => assert!(m.denied && m.to_string().contains("bound to another"), "{m}"),
            other => panic!("an impostor joined under a departed node's name: {other:?}"),
        }
        let mut b = [0u8; 64];
        region.read_at(0, &mut b).unwrap();
        assert_eq!(b, [0x11; 64], "edge {edge}: the owner's memory is as the node left it");
        let bee = rejoin(&mh.addr, "bee", &sb, edge);
        assert_eq!(bee.id(), bee_id, "edge {edge}: the node's own key brings its id back");
        bee.connect(owner.id()).unwrap().write(&region.handle(), 0, &[0x22; 64], OpFlags::default()).wait().unwrap();
        region.read_at(0, &mut b).unwrap();
        assert_eq!(b, [0x22; 64], "edge {edge}: the grant made before the restart still holds");
    }
}

/// The owner's record at the management host: its link address and its key.
fn record(mh: &str, node: u32) -> NodeInfo {
    observer(mh).resolve(node).expect("the owner is on record")
}

// Checks the edge handshake: a process holding the fabric secret that claims to be a node
// granted write access (its id), but signs with a key of its own, is refused by the owner
// (the owner closes the connection: the impostor never gets established), and the owner's
// memory stays untouched.
#[test]
fn an_edge_handshake_claiming_another_nodes_id_is_refused() {
    let mh = TestMh::start("identity-edge");
    let (sa, sb) = (TempDir::new("owner"), TempDir::new("bee"));
    let owner = node(&mh.addr, "owner", &sa, true).unwrap();
    let region = owner.alloc(4096, Access::ALL).unwrap();
    let bee = node(&mh.addr, "bee", &sb, true).unwrap();
    region.grant(bee.id(), Access::WRITE).unwrap();
    let info = record(&mh.addr, owner.id());
    let to: SocketAddr = info.links[0].parse().unwrap();
    let owner_key = public_from_hex(&info.key).expect("the owner's key is on record");
    let creds = Credentials::new(SECRET.as_bytes(), Arc::new(Identity::generate().unwrap().0));
    let mut conn = Connection::connect(Config::new(1, 1472), bee.id(), owner.id(), &creds, owner_key, [7; 32], 1, 0);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
    let (start, mut buf, mut target) = (Instant::now(), vec![0u8; 65536], MemTarget::default());
    let mut wrote = false;
    while start.elapsed() < Duration::from_secs(5) && !matches!(conn.state(), State::Closed(_)) {
        let now = start.elapsed().as_micros() as u64;
        if conn.state() == State::Established && !wrote {
            let r = RegionRef { region: region.handle().region(), key: region.handle().key() };
            conn.write(now, r, 0, &[0x66; 64], ProtoFlags::default()).unwrap();
            wrote = true;
        }
        while let Some(t) = conn.poll_transmit(now, &mut buf) {
            sock.send_to(&buf[..t.len], to).unwrap();
        }
        if let Ok(n) = sock.recv(&mut buf) {
            conn.handle_frame(start.elapsed().as_micros() as u64, 0, &buf[..n], &mut target);
        }
        if conn.poll_timeout().is_some_and(|t| t <= start.elapsed().as_micros() as u64) {
            conn.handle_timeout(start.elapsed().as_micros() as u64, &mut target);
        }
    }
    assert!(!wrote, "the impostor got established");
    assert_eq!(conn.state(), State::Closed(CloseReason::Peer(1)), "the owner refused the handshake");
    assert!(zeros(&region, 4096), "the owner's memory is untouched");
}

/// One control message on a shared-memory control socket, as JSON.
fn control(sock: &rackwire_shm::ControlSocket, msg: serde_json::Value) -> serde_json::Value {
    sock.send(msg.to_string().as_bytes(), &[]).unwrap();
    let mut buf = vec![0u8; 65536];
    let (n, _) = sock.recv(&mut buf).unwrap();
    serde_json::from_slice(&buf[..n]).unwrap()
}

// Checks the shared-memory handshake: a process holding the fabric secret that claims to be a
// granted node's id, proving the secret correctly but signing with its own key, is refused
// with a reason naming the signature, and the owner's memory stays untouched.
#[test]
fn a_shared_memory_handshake_claiming_another_nodes_id_is_refused() {
    let mh = TestMh::start("identity-shm");
    let (sa, sb) = (TempDir::new("owner"), TempDir::new("bee"));
    let owner = node(&mh.addr, "owner", &sa, false).unwrap();
    let region = owner.alloc(4096, Access::ALL).unwrap();
    let bee = node(&mh.addr, "bee", &sb, false).unwrap();
    region.grant(bee.id(), Access::WRITE).unwrap();
    let info = record(&mh.addr, owner.id());
    let sock = rackwire_shm::ControlSocket::connect(Path::new(info.shm_path.as_deref().unwrap())).unwrap();
    let (from, to) = (bee.id(), owner.id());
    // The exchange over the secret, done right (this process holds the secret).
    let ctx = format!("rackwire-shm {from}->{to}");
    let (pake, my_pake) = rackwire_mh::auth::Pake::start(SECRET.as_bytes(), true, ctx.as_bytes());
    let my_nonce = [3u8; 32];
    let hello =
        serde_json::json!({"t": "hello", "from": from, "to": to, "nonce": to_hex(&my_nonce), "pake": to_hex(&my_pake)});
    let challenge = control(&sock, hello);
    assert_eq!(challenge["t"], "challenge", "{challenge}");
    let their_nonce = from_hex(challenge["nonce"].as_str().unwrap()).unwrap();
    let their_pake = from_hex(challenge["pake"].as_str().unwrap()).unwrap();
    let key = pake.finish(&their_pake).expect("the owner's exchange message");
    // The transcript as the shared-memory handshake lays it out (labelled for the initiator).
    let transcript = [
        &b"rackwire-shm-initiator\0rackwire-shm-handshake-v2"[..],
        &from.to_be_bytes(),
        &to.to_be_bytes(),
        &my_nonce,
        &their_nonce,
        &my_pake,
        &their_pake,
    ]
    .concat();
    let proof = key.confirm("rackwire-peer-initiator", &transcript);
    let mallory = Identity::generate().unwrap().0;
    let signature = mallory.sign(b"anything: the key is not the node's");
    let answer =
        control(&sock, serde_json::json!({"t": "proof", "proof": to_hex(&proof), "signature": to_hex(&signature)}));
    assert_eq!(answer["t"], "refused", "{answer}");
    assert!(answer["reason"].as_str().unwrap().contains("not signed"), "{answer}");
    assert!(zeros(&region, 4096), "the owner's memory is untouched");
}

// Checks frames injected into a live edge connection from another socket: write frames aimed
// at the owner's region, addressed to the connection's id, sent unsealed and then with a
// made-up seal, are dropped and counted on the connection they were addressed to (`unsealed`,
// `forged`) and never placed; the genuine peer's traffic goes on.
#[test]
fn frames_injected_from_another_socket_are_dropped_and_counted() {
    let mh = TestMh::start("identity-inject");
    let (sa, sb) = (TempDir::new("owner"), TempDir::new("bee"));
    let owner = node(&mh.addr, "owner", &sa, true).unwrap();
    let region = owner.alloc(4096, Access::ALL).unwrap();
    let bee = node(&mh.addr, "bee", &sb, true).unwrap();
    region.grant(bee.id(), Access::WRITE).unwrap();
    let conn = bee.connect(owner.id()).unwrap();
    conn.write(&region.handle(), 1024, &[0x11; 8], OpFlags::default()).wait().unwrap();
    assert!(conn.stats().edge_or_zero().sealed);
    // A well-formed write frame for the owner's region (from an unsealed pair of connections).
    let h = region.handle();
    let cfg = Config::new(1, 1472);
    let (mut a, _b, _ta, _tb, now) = rackwire_sim::pair::established(cfg, SECRET.as_bytes(), h.region(), h.key(), 4096);
    a.write(now, RegionRef { region: h.region(), key: h.key() }, 0, &[0x66; 64], ProtoFlags::default()).unwrap();
    let (_, frame) = rackwire_sim::pair::drain(&mut a, now).remove(0);
    let to: SocketAddr = record(&mh.addr, owner.id()).links[0].parse().unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    // The owner's id for the connection, as anyone who sees its traffic would read it in the
    // frames' headers.
    let at_owner = owner.connect(bee.id()).unwrap();
    let conn_id = at_owner.stats().edge_or_zero().conn_id;
    {
        let mut plain = frame.clone();
        let mut f = rackwire_wire::Frame::new_unchecked(&mut plain[..]);
        f.set_conn(conn_id);
        f.fill_checksums();
        sock.send_to(&plain, to).unwrap();
        let mut sealed = plain.clone();
        rackwire_wire::Frame::new_unchecked(&mut sealed[..]).set_sealed();
        sealed.extend_from_slice(&[0x5a; rackwire_wire::SEALED_TRAILER_LEN]);
        sock.send_to(&sealed, to).unwrap();
    }
    // The owner's side of the connection counts what reached it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while (at_owner.stats().edge_or_zero().unsealed == 0 || at_owner.stats().edge_or_zero().forged == 0)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = at_owner.stats().edge_or_zero();
    assert!(s.unsealed >= 1 && s.forged >= 1, "injected frames counted: {s:?}");
    assert!(zeros_range(&region, 0, 1024), "nothing injected was placed");
    conn.write(&region.handle(), 2048, &[0x22; 8], OpFlags::default()).wait().unwrap();
}

fn zeros_range(r: &rackwire::Region, offset: u64, len: usize) -> bool {
    let mut b = vec![1u8; len];
    r.read_at(offset, &mut b).unwrap();
    b.iter().all(|&x| x == 0)
}

// Checks, over real sockets, that frames from another socket cannot steer a live edge
// connection (issue: one forged frame carrying a connection id, which travels in clear,
// moved the peer's address on that link): an unsealed acknowledgement, a sealed frame with a
// made-up tag and an unsealed handshake step, each addressed to the owner's id for its
// connection to the bee, come from an attacker's socket, over and over, while the owner
// writes into the bee's region: every write lands, and the attacker's socket receives
// nothing (the owner went on sending to the bee); the forged frames were counted.
#[test]
fn frames_from_another_socket_do_not_move_the_peers_address() {
    let mh = TestMh::start("identity-steer");
    let (sa, sb) = (TempDir::new("owner"), TempDir::new("bee"));
    let owner = node(&mh.addr, "owner", &sa, true).unwrap();
    let bee = node(&mh.addr, "bee", &sb, true).unwrap();
    let bee_region = bee.alloc(4096, Access::ALL).unwrap();
    bee_region.grant(owner.id(), Access::WRITE).unwrap();
    let region = owner.alloc(4096, Access::ALL).unwrap();
    region.grant(bee.id(), Access::WRITE).unwrap();
    // The bee opens the connection; the owner's side of it is the one forged frames aim at.
    let conn = bee.connect(owner.id()).unwrap();
    conn.write(&region.handle(), 0, &[0x11; 8], OpFlags::default()).wait().unwrap();
    let at_owner = owner.connect(bee.id()).unwrap();
    let conn_id = at_owner.stats().edge_or_zero().conn_id;
    let to: SocketAddr = record(&mh.addr, owner.id()).links[0].parse().unwrap();
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    let header = |kind, sealed: bool, payload: &[u8]| {
        let repr = rackwire_wire::FrameRepr {
            kind,
            link: 0,
            conn: conn_id,
            seq: 0,
            ack: Some(1_000_000),
            ts: 0,
            payload_len: payload.len() as u16,
        };
        let mut buf = vec![0u8; repr.buffer_len()];
        let mut f = repr.emit(&mut buf);
        f.payload_mut().copy_from_slice(payload);
        f.fill_checksums();
        if sealed {
            f.set_sealed();
            buf.extend_from_slice(&[0x5a; rackwire_wire::SEALED_TRAILER_LEN]);
        }
        buf
    };
    let hs = vec![0u8; rackwire_wire::payload::HANDSHAKE_LEN];
    let forgeries = [
        header(rackwire_wire::FrameKind::Ack, false, &[]),
        header(rackwire_wire::FrameKind::Data, true, &[0; 64]),
        header(rackwire_wire::FrameKind::Handshake, false, &hs),
    ];
    // The attacker sends them over and over (every millisecond for 400 ms) while the owner
    // writes into the bee's region (each write waits for its answer): a moved address would
    // send some of the owner's frames to the attacker before the bee's own frames moved it
    // back.
    let injector = {
        let attacker = attacker.try_clone().unwrap();
        std::thread::spawn(move || {
            for _ in 0..400 {
                for f in &forgeries {
                    attacker.send_to(f, to).unwrap();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    for k in 0..40u8 {
        at_owner.write(&bee_region.handle(), 0, &[k; 64], OpFlags::default()).wait().expect("the owner's write lands");
        std::thread::sleep(Duration::from_millis(5));
    }
    injector.join().unwrap();
    let mut b = [0u8; 64];
    bee_region.read_at(0, &mut b).unwrap();
    assert_eq!(b, [39; 64], "the last write landed");
    attacker.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut buf = [0u8; 2048];
    let got = attacker.recv_from(&mut buf);
    assert!(got.is_err(), "the owner sent to the attacker: {got:?}");
    // Each forged frame reached the connection and was counted there.
    let counted = |s: rackwire::ConnStats| {
        let e = s.edge_or_zero();
        e.unsealed + e.forged + e.unproven + e.malformed
    };
    assert!(counted(at_owner.stats()) >= 3, "the forged frames reached the connection: {:?}", at_owner.stats());
}

// Checks that first frames naming node ids this node does not know cannot make it ask the
// management host without end (issue: every forged first frame naming a random id started a
// lookup, none remembered): 300 Hellos name one id no node has, then 300 name ids counted up
// from it, all sent to an edge node's link from another socket within a moment. The node
// skips most of them (`rackwire_key_lookups_skipped_total`: the unknown id remembered after
// its first lookup, the others past the rate of 64 lookups a second), and still serves a
// genuine peer afterwards.
#[test]
fn first_frames_naming_unknown_nodes_are_not_looked_up_without_end() {
    let mh = TestMh::start("identity-unknown");
    let (sa, sb) = (TempDir::new("owner"), TempDir::new("bee"));
    let owner = node(&mh.addr, "owner", &sa, true).unwrap();
    let to: SocketAddr = record(&mh.addr, owner.id()).links[0].parse().unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let hello = |from: u32| first_hello(from, owner.id());
    let unknown = 3_000_000_000u32;
    let one = hello(unknown);
    for _ in 0..300 {
        sock.send_to(&one, to).unwrap();
        std::thread::sleep(Duration::from_micros(300));
    }
    for k in 1..=300 {
        sock.send_to(&hello(unknown + k), to).unwrap();
    }
    let skipped = || {
        owner
            .metrics()
            .lines()
            .find_map(|l| l.strip_prefix("rackwire_key_lookups_skipped_total ").map(|v| v.parse::<f64>().unwrap()))
            .unwrap_or(0.0)
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while skipped() < 400.0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(skipped() >= 400.0, "only {} of 600 first frames skipped a lookup", skipped());
    let bee = node(&mh.addr, "bee", &sb, true).unwrap();
    let region = owner.alloc(4096, Access::ALL).unwrap();
    region.grant(bee.id(), Access::WRITE).unwrap();
    bee.connect(owner.id()).unwrap().write(&region.handle(), 0, b"still", OpFlags::default()).wait().unwrap();
}

// Checks the stateless retry over real sockets: 20 first frames naming 20 real nodes (their
// keys on record), sent from another socket that never answers, fill the owner's accepted
// handshakes past HANDSHAKES_BEFORE_RETRY; a genuine node then connects and writes at once
// (well within the 5 s those handshakes hold their slots): the owner answered its Hello with a
// Retry (counted in the bee's connection stats), and its Hello with the token opened the
// connection.
#[test]
fn under_load_a_genuine_node_connects_through_a_retry() {
    let mh = TestMh::start("identity-retry");
    let (sa, sb) = (TempDir::new("owner"), TempDir::new("bee"));
    let owner = node(&mh.addr, "owner", &sa, true).unwrap();
    let region = owner.alloc(4096, Access::ALL).unwrap();
    let to: SocketAddr = record(&mh.addr, owner.id()).links[0].parse().unwrap();
    let dirs: Vec<TempDir> = (0..20).map(|i| TempDir::new(&format!("n{i}"))).collect();
    let named: Vec<Fabric> =
        dirs.iter().enumerate().map(|(i, d)| node(&mh.addr, &format!("n{i}"), d, true).unwrap()).collect();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let hello = |from: u32| first_hello(from, owner.id());
    // Each twice: the first makes the owner look the node's key up, the second opens.
    for round in 0..2 {
        for n in &named {
            sock.send_to(&hello(n.id()), to).unwrap();
        }
        std::thread::sleep(Duration::from_millis(if round == 0 { 300 } else { 50 }));
    }
    let bee = node(&mh.addr, "bee", &sb, true).unwrap();
    region.grant(bee.id(), Access::WRITE).unwrap();
    let t = Instant::now();
    let conn = bee.connect(owner.id()).unwrap();
    conn.write(&region.handle(), 0, b"through", OpFlags::default()).wait().unwrap();
    assert!(t.elapsed() < Duration::from_secs(3), "the genuine node waited {:?}", t.elapsed());
    assert!(conn.stats().edge_or_zero().retries >= 1, "the owner asked for a retry: {:?}", conn.stats());
    let mut b = [0u8; 7];
    region.read_at(0, &mut b).unwrap();
    assert_eq!(&b, b"through");
}

/// A first handshake frame (a Hello) from node `from` to node `to`, as a caller holding the
/// secret sends it (from the simulator's pair, whose ends are nodes 1 and 2, renamed).
fn first_hello(from: u32, to: u32) -> Vec<u8> {
    let (mut a, _b) = rackwire_sim::pair::connecting_as(
        Config::new(1, 1472),
        &rackwire_sim::keys::credentials(from, SECRET.as_bytes()),
        &rackwire_sim::keys::credentials(to, SECRET.as_bytes()),
    );
    let mut f = rackwire_sim::pair::drain(&mut a, 0).remove(0).1;
    let mut h = rackwire_wire::HandshakeRepr::parse(&f[rackwire_wire::HEADER_LEN..]).unwrap();
    (h.from, h.to) = (from, to);
    h.emit(&mut f[rackwire_wire::HEADER_LEN..]);
    rackwire_wire::Frame::new_unchecked(&mut f[..]).fill_checksums();
    f
}

// Checks what a process with no name of its own (a job's rank) gets, as a later process that
// happens to be given the same process id would meet it: each join makes a key pair of its
// own in memory and a name of its own (the base name and the key's start), so the second
// process, with the same configuration and state folder, gets another name and id and none
// of the first one's grants (its write is refused); and nothing is left in the state folder.
#[test]
fn a_process_with_no_name_of_its_own_inherits_nothing_from_an_earlier_one() {
    let mh = TestMh::start("identity-transient");
    let (so, st) = (TempDir::new("owner"), TempDir::new("transient"));
    let owner = node(&mh.addr, "owner", &so, false).unwrap();
    let region = owner.alloc(4096, Access::ALL).unwrap();
    let passing = || {
        let mut cfg = FabricConfig::new(&mh.addr, SECRET, "node-4242");
        cfg.transient = true;
        cfg.state_dir = Some(st.0.clone());
        Fabric::join(cfg).unwrap()
    };
    let first = passing();
    let (first_id, first_name) = (first.id(), first.name().to_string());
    assert!(first_name.starts_with("node-4242-") && first_name.len() == "node-4242-".len() + 8, "{first_name}");
    region.grant(first_id, Access::WRITE).unwrap();
    first.connect(owner.id()).unwrap().write(&region.handle(), 0, &[7; 64], OpFlags::default()).wait().unwrap();
    drop(first);
    let second = passing();
    assert_ne!(second.id(), first_id, "a new process is a new node");
    assert_ne!(second.name(), first_name);
    let refused = second.connect(owner.id()).unwrap().write(&region.handle(), 64, &[9; 64], OpFlags::default()).wait();
    assert!(refused.is_err(), "the earlier process's grant is not the new one's: {refused:?}");
    let mut b = vec![0u8; 64];
    region.read_at(64, &mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0), "nothing written by the refused process");
    let left: Vec<_> = walk(&st.0);
    assert!(left.is_empty(), "a transient node keeps no files: {left:?}");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    rd.flatten().flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] }).collect()
}
