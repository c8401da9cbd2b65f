//! Fuzz bodies shared by the property tests and the fuzz targets.

use rackwire_proto::{Config, OpFlags, RegionRef};
use rackwire_wire::{Frame, FrameRepr};

use crate::{keys, pair};

const MTU: usize = 1472;

/// Feed an established connection the frames encoded in `data`: each chunk is
/// `[link, len_hi, len_lo, bytes...]`; header lengths and checksums of every chunk are fixed up
/// so that the fuzzer reaches past them into the protocol (the connection's frames are
/// unsealed, so a made-up frame is taken as it is). The same frames also go to a sealed
/// connection, where they must be dropped (they cannot carry a valid tag) without panicking
/// and without placing anything. Must never panic.
pub fn fuzz_connection(data: &[u8]) {
    let (mut a, mut b, _ta, mut tb, mut now) = pair::established(Config::new(2, MTU), b"fuzzing-secret", 1, 7, 1 << 16);
    let (sa, sb) =
        (keys::credentials(pair::A_NODE, b"fuzzing-secret"), keys::credentials(pair::B_NODE, b"fuzzing-secret"));
    let (_, mut sealed, _, mut st, _) = pair::established_as(Config::new(2, MTU), &sa, &sb, 1, 7, 1 << 16);
    let _ = a.write(now, RegionRef { region: 1, key: 7 }, 0, b"seed traffic", OpFlags::default());
    let mut buf = vec![0u8; 65536];
    let mut rest = data;
    while rest.len() >= 3 {
        let link = rest[0] as usize % 3;
        let len = (u16::from_be_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3).min(4096);
        let mut frame = rest[3..3 + len].to_vec();
        rest = &rest[3 + len..];
        sealed.handle_frame(now, link, &frame, &mut st);
        Frame::new_unchecked(&mut frame[..]).seal();
        b.handle_frame(now, link, &frame, &mut tb);
        sealed.handle_frame(now, link, &frame, &mut st);
        b.handle_timeout(now, &mut tb);
        while let Some(t) = b.poll_transmit(now, &mut buf) {
            assert!(t.len <= buf.len());
            if let Ok(f) = Frame::new_checked(&buf[..t.len]) {
                assert!(FrameRepr::parse(&f).is_ok(), "we emit only frames we can parse");
            }
        }
        while b.poll_event().is_some() {}
        now += 7;
    }
    assert!(st.regions[&1].data.iter().all(|&x| x == 0), "nothing reached the sealed connection's memory");
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that the connection survives arbitrary (checksum-valid) frames without panicking,
    // on a fixed set of pseudo-random inputs (the fuzz target explores further).
    #[test]
    fn connection_survives_arbitrary_frames() {
        let mut r = crate::Rng::new(99);
        for _ in 0..300 {
            let n = r.range(0, 600) as usize;
            let mut data: Vec<u8> = (0..n).map(|_| r.next_u64() as u8).collect();
            // Make some inputs plausible data frames aimed at the right connection.
            if data.len() > 40 && r.chance(0.5) {
                data[3 + 3] = 1; // kind: data
                data[3 + 4] = 0; // flags
                data[3 + 8..3 + 12].copy_from_slice(&22u32.to_be_bytes());
            }
            fuzz_connection(&data);
        }
    }
}
