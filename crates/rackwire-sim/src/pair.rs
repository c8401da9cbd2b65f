//! The two-endpoint harness: two connections driven by hand, frames moved between them
//! without a network. The protocol tests and the fuzz bodies use it; the simulator's
//! [`crate::World`] is the many-node, lossy version.

use rackwire_proto::{Config, Connection, Credentials, Event, State, Time};

use crate::{keys, MemTarget};

/// Node ids and connection ids of the two ends.
pub const A_NODE: u32 = 1;
/// See [`A_NODE`].
pub const B_NODE: u32 = 2;

/// `a` connecting to `b` (nothing exchanged yet), each with its secret and its own node key,
/// frames unsealed (so that tests can forge and inspect them; [`connecting_as`] chooses).
pub fn connecting(cfg: Config, secret_a: &[u8], secret_b: &[u8]) -> (Connection, Connection) {
    connecting_as(cfg, &keys::unsealed(A_NODE, secret_a), &keys::unsealed(B_NODE, secret_b))
}

/// `a` connecting to `b` with the given credentials; each expects the other's own node key.
pub fn connecting_as(cfg: Config, a: &Credentials, b: &Credentials) -> (Connection, Connection) {
    let ca = Connection::connect(cfg.clone(), A_NODE, B_NODE, a, keys::public_key(B_NODE), [1; 32], 11, 0);
    let cb = Connection::accept(cfg, B_NODE, b, A_NODE, keys::public_key(A_NODE), [2; 32], 22, 0);
    (ca, cb)
}

/// Move every frame between two connections (link by link, 10 µs per hop) until quiet.
/// Returns the frames that went from `a` to `b`, for replay tests.
pub fn pump(
    a: &mut Connection,
    b: &mut Connection,
    now: &mut Time,
    ta: &mut MemTarget,
    tb: &mut MemTarget,
) -> Vec<(usize, Vec<u8>)> {
    let mut buf = vec![0u8; 65536];
    let mut a_to_b = Vec::new();
    for _ in 0..100 {
        let mut moved = false;
        while let Some(t) = a.poll_transmit(*now, &mut buf) {
            a_to_b.push((t.link, buf[..t.len].to_vec()));
            b.handle_frame(*now + 10, t.link, &buf[..t.len], tb);
            moved = true;
        }
        while let Some(t) = b.poll_transmit(*now, &mut buf) {
            a.handle_frame(*now + 10, t.link, &buf[..t.len], ta);
            moved = true;
        }
        *now += 10;
        if !moved {
            break;
        }
    }
    a_to_b
}

/// Two established connections sharing `secret` (frames unsealed), with a region (`region`,
/// `key`, `len` bytes) at `b` granted to `a`. Panics if the handshake does not complete.
pub fn established(
    cfg: Config,
    secret: &[u8],
    region: u32,
    key: u128,
    len: usize,
) -> (Connection, Connection, MemTarget, MemTarget, Time) {
    let (a, b) = (keys::unsealed(A_NODE, secret), keys::unsealed(B_NODE, secret));
    established_as(cfg, &a, &b, region, key, len)
}

/// [`established`] with the given credentials (sealed frames with [`keys::credentials`]).
pub fn established_as(
    cfg: Config,
    ca: &Credentials,
    cb: &Credentials,
    region: u32,
    key: u128,
    len: usize,
) -> (Connection, Connection, MemTarget, MemTarget, Time) {
    let (mut a, mut b) = connecting_as(cfg, ca, cb);
    let (mut ta, mut tb, mut now) = (MemTarget::default(), MemTarget::default(), 0);
    tb.add_region(region, key, len, &[A_NODE]);
    pump(&mut a, &mut b, &mut now, &mut ta, &mut tb);
    assert_eq!(a.state(), State::Established, "the pair's handshake completes");
    (a, b, ta, tb, now)
}

/// Every frame `a` sends now, whole.
pub fn drain(a: &mut Connection, now: Time) -> Vec<(usize, Vec<u8>)> {
    let mut buf = vec![0u8; 65536];
    std::iter::from_fn(|| a.poll_transmit(now, &mut buf).map(|t| (t.link, buf[..t.len].to_vec()))).collect()
}

/// Every event `c` has now.
pub fn events(c: &mut Connection) -> Vec<Event> {
    std::iter::from_fn(|| c.poll_event()).collect()
}

/// The messages among `c`'s events now (the other events are dropped).
pub fn messages(c: &mut Connection) -> Vec<Vec<u8>> {
    events(c)
        .into_iter()
        .filter_map(|e| match e {
            Event::Message { data } => Some(data),
            _ => None,
        })
        .collect()
}
