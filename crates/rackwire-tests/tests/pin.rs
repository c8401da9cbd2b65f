//! Pinned targets ([`rackwire::Conn::pin`]): lock-free writes into a peer's region over shared
//! memory, and revocation still keeping its promise with them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rackwire::{Access, Error, Fabric, ManagementHost, RevokeOutcome, Signal};

const SECRET: &str = "pin-test-secret-0123456789abcdef";

fn node(mh: &rackwire::MhHandle, name: &str, edge: bool) -> Fabric {
    rackwire_tests::thread_node(mh, SECRET, name, edge)
}

// Checks what a pin does: its write and write-with-signal place the bytes and the signal word
// (set and add, the add yielding the old value) exactly as the connection's calls do; out of
// bounds and ungranted access are refused by the pin with the same errors, touching nothing;
// and its writes are counted in the connection's statistics once it is dropped.
#[test]
fn a_pin_writes_like_the_connection_and_refuses_like_it() {
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    let owner = node(&mh, "pin-owner", false);
    let user = node(&mh, "pin-user", false);
    let region = owner.alloc(4096, Access::READ | Access::WRITE | Access::ATOMIC).unwrap();
    region.grant(user.id(), Access::WRITE).unwrap();
    let conn = user.connect(owner.id()).unwrap();
    assert_eq!(conn.transport(), "shm");
    let h = region.handle();
    let before = conn.stats().writes;
    {
        let mut pin = conn.pin(&h, Access::WRITE).unwrap();
        pin.write(16, b"pinned bytes").unwrap();
        assert_eq!(pin.write_signal(64, b"data", Signal::set(128, 7)).unwrap(), 0);
        assert_eq!(region.to_vec(16, 12).unwrap(), b"pinned bytes");
        assert_eq!(region.to_vec(64, 4).unwrap(), b"data");
        assert_eq!(region.load_u64(128).unwrap(), 7);
        // Out of bounds: nothing stored, not even the signal.
        let e = pin.write_signal(4094, b"four", Signal::set(136, 9)).unwrap_err();
        assert!(matches!(e, Error::OutOfBounds { offset: 4094, len: 4, region_len: 4096, .. }), "{e:?}");
        assert_eq!(region.load_u64(136).unwrap(), 0);
        // The grant has no atomic access: an add is refused.
        let e = pin.write_signal(0, &[], Signal::add(128, 1)).unwrap_err();
        assert!(matches!(e, Error::Ungranted { .. }), "{e:?}");
        assert_eq!(region.load_u64(128).unwrap(), 7);
    }
    assert_eq!(conn.stats().writes, before + 2, "the pin's two writes are counted when it is dropped");
    // With atomic access granted, a new pin adds and yields the old value.
    region.grant(user.id(), Access::WRITE | Access::ATOMIC).unwrap();
    let mut pin = conn.pin(&h, Access::WRITE | Access::ATOMIC).unwrap();
    assert_eq!(pin.write_signal(0, &[], Signal::add(128, 5)).unwrap(), 7);
    assert_eq!(region.load_u64(128).unwrap(), 12);
}

// Checks that revocation holds with a pin in use: a thread writes an increasing counter
// through its pin as fast as it can while the owner revokes the grant. Once revoke returns
// (the peer confirmed the unmap), the owner's copy of the counter never changes again, and
// the writer's next pinned write fails with `Revoked` (as does its ordinary write). Bounded:
// the writer stops at its first error or after 10 s.
#[test]
fn revocation_stops_a_pin_in_use() {
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    let owner = node(&mh, "pin-rev-owner", false);
    let user = Arc::new(node(&mh, "pin-rev-user", false));
    let region = owner.alloc(4096, Access::READ | Access::WRITE).unwrap();
    region.grant(user.id(), Access::WRITE).unwrap();
    let h = region.handle();
    let started = Arc::new(AtomicBool::new(false));
    let writer = {
        let (user, started, owner_id) = (user.clone(), started.clone(), owner.id());
        std::thread::spawn(move || {
            let conn = user.connect(owner_id).unwrap();
            let mut pin = conn.pin(&h, Access::WRITE).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut i = 0u64;
            loop {
                i += 1;
                if let Err(e) = pin.write(0, &i.to_le_bytes()) {
                    return (e, conn.write(&h, 0, b"late", rackwire::OpFlags::NONE).wait());
                }
                started.store(true, Ordering::Relaxed);
                assert!(Instant::now() < deadline, "the pin was never stopped");
            }
        })
    };
    while !started.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(region.revoke(user.id()).unwrap(), RevokeOutcome::Unmapped);
    let at_revoke = region.load_u64(0).unwrap();
    assert!(at_revoke > 0, "the writer wrote before the revocation");
    let (pinned, ordinary) = writer.join().unwrap();
    assert!(matches!(pinned, Error::Revoked { .. }), "pinned write after revocation: {pinned:?}");
    assert!(matches!(ordinary, Err(Error::Revoked { .. })), "ordinary write after revocation: {ordinary:?}");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(region.load_u64(0).unwrap(), at_revoke, "a pinned write landed after the revocation");
}

// Checks that pinning is refused with a clear error where the peer's memory is not mapped
// into this process (the edge transport).
#[test]
fn pinning_needs_shared_memory() {
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    let owner = node(&mh, "pin-edge-owner", true);
    let user = node(&mh, "pin-edge-user", true);
    let region = owner.alloc(4096, Access::READ | Access::WRITE).unwrap();
    region.grant(user.id(), Access::WRITE).unwrap();
    let conn = user.connect(owner.id()).unwrap();
    assert_eq!(conn.transport(), "edge");
    let e = conn.pin(&region.handle(), Access::WRITE).unwrap_err();
    assert!(matches!(e, Error::Config(ref m) if m.contains("shared-memory")), "{e:?}");
}

// Checks the receiving end of a signal, `Region::wait_u64`: two nodes play ping-pong through
// pins, each writing the ball (its round number in 8 bytes of data) and then a signal word
// in the other's region, and each waiting for the word with `Cmp::Ge` before reading the
// data, 2000 rounds (bounded: each wait gives up after 10 s). Every data word read after a
// signal must be the round the signal announced (the data is in place when the word shows).
// Then: a word that never changes gives `Timeout` after about the time asked for, `Cmp`'s
// six ways compare as named, and misaligned or out-of-bounds words are refused.
#[test]
fn a_signal_wait_sees_the_data_it_follows() {
    use rackwire::Cmp;
    const ROUNDS: u64 = 2000;
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes()).unwrap();
    let a = node(&mh, "wait-a", false);
    let b = Arc::new(node(&mh, "wait-b", false));
    let ra = a.alloc(4096, Access::READ | Access::WRITE).unwrap();
    let rb = b.alloc(4096, Access::READ | Access::WRITE).unwrap();
    ra.grant(b.id(), Access::WRITE).unwrap();
    rb.grant(a.id(), Access::WRITE).unwrap();
    let (ha, hb) = (ra.handle(), rb.handle());
    let ponger = {
        let (b, a_id) = (b.clone(), a.id());
        std::thread::spawn(move || {
            let conn = b.connect(a_id).unwrap();
            let mut pin = conn.pin(&ha, Access::WRITE).unwrap();
            for i in 1..=ROUNDS {
                rb.wait_u64(0, Cmp::Ge, i, Duration::from_secs(10)).unwrap();
                let ball = rb.load_u64(8).unwrap();
                pin.write_signal(8, &ball.to_le_bytes(), Signal::set(0, i)).unwrap();
            }
        })
    };
    let conn = a.connect(b.id()).unwrap();
    let mut pin = conn.pin(&hb, Access::WRITE).unwrap();
    for i in 1..=ROUNDS {
        pin.write_signal(8, &(i * 1000).to_le_bytes(), Signal::set(0, i)).unwrap();
        assert_eq!(ra.wait_u64(0, Cmp::Ge, i, Duration::from_secs(10)).unwrap(), i);
        assert_eq!(ra.load_u64(8).unwrap(), i * 1000, "the data of round {i} came with its signal");
    }
    ponger.join().unwrap();
    let t = Instant::now();
    assert!(matches!(ra.wait_u64(0, Cmp::Gt, ROUNDS, Duration::from_millis(50)), Err(Error::Timeout)));
    assert!(t.elapsed() >= Duration::from_millis(50));
    assert_eq!(ra.wait_u64(0, Cmp::Eq, ROUNDS, Duration::ZERO).unwrap(), ROUNDS, "a word that holds already");
    let holds = |c: Cmp| [(1, 2), (2, 2), (3, 2)].map(|(w, v)| c.holds(w, v));
    assert_eq!(holds(Cmp::Eq), [false, true, false]);
    assert_eq!(holds(Cmp::Ne), [true, false, true]);
    assert_eq!(holds(Cmp::Gt), [false, false, true]);
    assert_eq!(holds(Cmp::Ge), [false, true, true]);
    assert_eq!(holds(Cmp::Lt), [true, false, false]);
    assert_eq!(holds(Cmp::Le), [true, true, false]);
    assert!(matches!(ra.wait_u64(4, Cmp::Eq, 0, Duration::ZERO), Err(Error::Misaligned { offset: 4 })));
    assert!(matches!(ra.wait_u64(4096, Cmp::Eq, 0, Duration::ZERO), Err(Error::OutOfBounds { .. })));
}
