//! Data frames' payloads. An operation's bytes are held once, as [`Bytes`] (copied when it is
//! submitted from a borrowed slice, not at all when handed over owned); every frame that carries
//! part of them, and every retransmission of that frame, refers to its part, so a driver hands
//! the kernel the header and the body as two pieces of one datagram.

use bytes::Bytes;
use rackwire_wire::SEGMENT_LEN;

/// A data frame's payload: the segment header and the body, with their CRC32C computed once
/// (a retransmission only rewrites the frame header).
#[derive(Clone, Debug)]
pub(crate) struct DataPayload {
    pub seg: [u8; SEGMENT_LEN],
    pub body: Option<Bytes>,
    pub crc: u32,
}

impl DataPayload {
    pub fn new(seg: [u8; SEGMENT_LEN], body: Option<Bytes>) -> Self {
        let mut crc = crc32c::crc32c(&seg);
        if let Some(b) = &body {
            crc = crc32c::crc32c_append(crc, b);
        }
        DataPayload { seg, body, crc }
    }

    pub fn len(&self) -> usize {
        SEGMENT_LEN + self.body.as_ref().map_or(0, Bytes::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a payload's CRC equals the CRC of its segment and body laid end to end.
    #[test]
    fn crc_of_parts() {
        let body = Bytes::from_static(b"0123456789").slice(3..6);
        let p = DataPayload::new([7u8; SEGMENT_LEN], Some(body));
        let mut whole = vec![7u8; SEGMENT_LEN];
        whole.extend_from_slice(b"345");
        assert_eq!(p.crc, crc32c::crc32c(&whole));
        assert_eq!(p.len(), whole.len());
    }
}
