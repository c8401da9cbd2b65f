//! Wire formats of the rackwire edge transport.
//!
//! Every frame starts with a fixed 32-byte [header](frame) that carries a version and its own
//! CRC32C; the payload has a CRC32C of its own. Each format is a checked *view* over a byte
//! buffer (`new_checked` validates everything once, after which no accessor can panic) and a
//! small validated *representation* with `parse`, `emit` and `buffer_len`. Errors name the
//! field that failed. Parsing arbitrary bytes never panics: [`check_any`] is the body shared by
//! the property tests and the fuzz target.
//!
//! All multi-byte fields are big-endian (network order).

#![deny(unsafe_code)]

pub mod auth;
pub mod crc;
mod error;
pub mod frame;
pub mod identity;
pub mod kx;
pub mod owner_only;
pub mod payload;

pub use error::WireError;
pub use frame::{Frame, FrameKind, FrameRepr, FLAG_SEALED, HEADER_LEN, SEALED_TRAILER_LEN};
pub use payload::{
    segments, AckRepr, CloseRepr, HandshakeRepr, HandshakeStep, ProbeRepr, RangesRepr, SegKind, Segment, SegmentRepr,
    Segments, ACK_DUP_RANGES_MAX, ACK_RANGES_MAX, SEGMENTS_PER_FRAME_MAX, SEGMENT_LEN, SEGMENT_SHORT_LEN, SEG_MORE,
};

/// [`check_any`] on `data`, and on a copy of it made into a frame that passes the header
/// checks (magic, version, length, both checksums), so that fuzzing reaches the payload parsers
/// instead of stopping at a checksum. Never panics.
pub fn check_sealed(data: &[u8]) {
    check_any(data);
    let mut f = data.to_vec();
    if Frame::new_unchecked(&mut f[..]).seal() {
        check_any(&f);
    }
}

/// Parse `data` as a frame and its payload in every way a receiver would, discarding the
/// results. Never panics, whatever the bytes: the property tests and the fuzz target run it.
pub fn check_any(data: &[u8]) {
    let Ok(frame) = Frame::new_checked(data) else { return };
    let Ok(repr) = FrameRepr::parse(&frame) else { return };
    let payload = frame.payload();
    match repr.kind {
        FrameKind::Data => {
            for seg in payload::segments(payload) {
                let Ok((_, body)) = seg else { break };
                let _ = body.len();
            }
        }
        FrameKind::Ack => {
            let _ = AckRepr::parse(payload);
        }
        FrameKind::Nack => {
            let _ = RangesRepr::parse(payload);
        }
        FrameKind::Handshake => {
            let _ = HandshakeRepr::parse(payload);
        }
        FrameKind::Probe => {
            let _ = ProbeRepr::parse(payload);
        }
        FrameKind::Close => {
            let _ = CloseRepr::parse(payload);
        }
        FrameKind::Datagram | FrameKind::Unknown(_) => {}
    }
}
