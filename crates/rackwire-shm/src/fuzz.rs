//! Fuzz bodies shared by the property tests and the fuzz targets: shared memory a peer can
//! write is input, and nothing a peer writes there may panic the other side.

use crate::mem::{MapAccess, SharedMem};
use crate::ring::{RingReceiver, RingSender, RING_BYTES_MIN};
use crate::{Doorbell, DoorbellRemote};

/// Bytes of the ring the body scribbles on (its smallest capacity, so that steps reach every
/// part of it).
const FUZZ_RING_BYTES: u64 = RING_BYTES_MIN;

/// Steps the body takes at most from one input.
const FUZZ_STEPS_MAX: usize = 4096;

/// Run a live ring and doorbell through the steps `data` encodes, a peer scribbling on their
/// shared words in between. Each step is a byte picking what happens, then its arguments:
///
/// - `0`: the sender pushes a record of `len` bytes (`len` from the next two bytes);
/// - `1`: the receiver pops a record (copying it), `2`: pops it in place, `3`: looks whether
///   one waits (its watch, which reads the shared head);
/// - `4`: a peer writes the 8 bytes that follow at the offset of the next two bytes (anywhere
///   in the ring's mapping: head, magic, capacity, stamps, lengths, kinds, payloads);
/// - `5`: a peer writes the doorbell's flag word, then the sender rings and the receiver arms,
///   rings itself and disarms;
/// - `6`: a second sender attaches to the ring as it is now (whatever its header says).
///
/// Must never panic: a broken ring is an error from `pop` (the transport then cuts the peer
/// off), never a crash.
pub fn scribble_ring(data: &[u8]) {
    let Ok(mut rx) = RingReceiver::create("rackwire-fuzz-ring", FUZZ_RING_BYTES) else { return };
    let attach = |rx: &RingReceiver| {
        let fd = rustix::io::dup(rx.mem().fd()).ok()?;
        RingSender::attach(SharedMem::from_fd(fd, MapAccess::ReadWrite).ok()?).ok()
    };
    let Some(mut tx) = attach(&rx) else { return };
    // The peer's own mapping of the ring, through which it scribbles.
    let Some(peer) =
        rustix::io::dup(rx.mem().fd()).ok().and_then(|fd| SharedMem::from_fd(fd, MapAccess::ReadWrite).ok())
    else {
        return;
    };
    let watch = rx.watch();
    let Ok(bell) = Doorbell::new() else { return };
    let [page, efd] = bell.fds();
    let (Ok(page), Ok(efd)) = (page.try_clone_to_owned(), efd.try_clone_to_owned()) else { return };
    let Ok(remote) = DoorbellRemote::attach(page, efd) else { return };
    let Some(bell_page) =
        rustix::io::dup(bell.fds()[0]).ok().and_then(|fd| SharedMem::from_fd(fd, MapAccess::ReadWrite).ok())
    else {
        return;
    };
    let payload = [0x5au8; FUZZ_RING_BYTES as usize];
    let mut out = Vec::new();
    let mut rest = data;
    let take = |n: usize, rest: &mut &[u8]| -> Option<Vec<u8>> {
        let got = rest.get(..n)?.to_vec();
        *rest = &rest[n..];
        Some(got)
    };
    for _ in 0..FUZZ_STEPS_MAX {
        let Some(step) = take(1, &mut rest) else { break };
        match step[0] % 7 {
            0 => {
                let Some(n) = take(2, &mut rest) else { break };
                let len = (u16::from_le_bytes([n[0], n[1]]) as usize).min(payload.len());
                let _ = tx.push(7, &[&payload[..len]]);
            }
            1 => {
                let _ = rx.pop(&mut out);
            }
            2 => {
                let _ = rx.pop_with(|kind, body| (kind, body.len(), body.first().copied()));
            }
            3 => {
                let _ = (watch.pending(), rx.is_empty());
            }
            4 => {
                let (Some(at), Some(word)) = (take(2, &mut rest), take(8, &mut rest)) else { break };
                let at = u16::from_le_bytes([at[0], at[1]]) as u64 % peer.len() as u64;
                let end = (at as usize + word.len()).min(peer.len());
                peer.write_at(at, &word[..end - at as usize]);
            }
            5 => {
                let Some(word) = take(8, &mut rest) else { break };
                bell_page.write_at(0, &word);
                remote.ring();
                bell.arm();
                bell.ring_local();
                bell.disarm();
                let _ = bell.wait(Some(std::time::Duration::ZERO));
            }
            _ => {
                if let Some(again) = attach(&rx) {
                    tx = again;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        // Checks that a live ring and doorbell survive a peer scribbling on any of their shared
        // words between pushes, pops and looks (issue: an unaligned head written by a peer
        // panicked the owner's thread that looked at the ring): the body runs arbitrary steps,
        // weighted so that scribbles land on the header and the first records, and returns;
        // a panic fails the case (the fuzz target explores further).
        #[test]
        fn a_scribbled_ring_never_panics(steps in proptest::collection::vec(
            prop_oneof![
                (0u16..600).prop_map(|n| [vec![0], n.to_le_bytes().to_vec()].concat()),
                Just(vec![1u8]),
                Just(vec![2u8]),
                Just(vec![3u8]),
                ((0u16..400), any::<u64>()).prop_map(|(at, w)| [vec![4], at.to_le_bytes().to_vec(), w.to_le_bytes().to_vec()].concat()),
                any::<u64>().prop_map(|w| [vec![5], w.to_le_bytes().to_vec()].concat()),
                Just(vec![6u8]),
            ],
            0..64,
        )) {
            scribble_ring(&steps.concat());
        }
    }

    // Checks the case the issue found, on its own: a peer writes an unaligned head into the
    // ring, and the receiver's watch (which reads the shared head) and its pops return
    // instead of panicking; a sender attached afterwards works from an aligned position.
    #[test]
    fn an_unaligned_head_is_not_a_crash() {
        let mut steps = vec![0, 40, 0];
        steps.extend([4, 0, 0]);
        steps.extend(3u64.to_le_bytes());
        steps.extend([3, 1, 2, 6, 0, 8, 0, 3, 1]);
        scribble_ring(&steps);
    }
}
