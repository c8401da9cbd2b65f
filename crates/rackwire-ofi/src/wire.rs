//! The provider's messages on the fabric: a fixed header, then the payload, in one rackwire
//! message. A message larger than one rackwire message goes as a first fragment and next
//! fragments, which the peer's connection delivers in order. RMA and atomics are requests
//! the target's provider checks and carries out, and answers (see [`Kind`] for what each
//! header field holds in each).

/// Bytes of the longest header (every kind but a whole message's).
pub const HEADER_BYTES: usize = 48;
/// Bytes of a whole message's header: no message number and no length or offset, so that a
/// small tagged message with remote CQ data and the shared-memory ring's record header fit
/// one cache line (16 + 32 + 8 bytes for 8 bytes of payload), which the receiver takes in one
/// transfer between cores where a second line would cost a second.
pub const WHOLE_HEADER_BYTES: usize = 32;
/// Payload bytes one rackwire message carries.
pub const FRAGMENT_BYTES_MAX: usize = rackwire::MESSAGE_BYTES_MAX - HEADER_BYTES;

/// What a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A whole message.
    Whole,
    /// The first piece of a message of `total` bytes.
    First,
    /// A further piece, at `offset` of the message.
    Next,
    /// A piece of an RMA write: `tag` is the key, `len_or_offset` the target address of this
    /// piece, `data` the remote CQ data, `msg_id` the operation; `last` on its last piece.
    Write,
    /// An RMA read: `tag` the key, `len_or_offset` the address, `data` the length.
    ReadReq,
    /// A piece of a read's answer: `len_or_offset` its offset in the read, `last` on the last.
    ReadResp,
    /// An atomic: `tag` the key, `len_or_offset` the address, `data` the operation
    /// ([`crate::rma::AtomicReq`]); the payload its operands (then its compare values).
    Atomic,
    /// The end of a write, a read or an atomic: `data` is 0 or the error (positive), the
    /// payload an atomic's old values.
    Ack,
}

/// A message's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What it is.
    pub kind: Kind,
    /// Sent with a tag (`fi_tsend`) rather than as a plain message (`fi_send`).
    pub tagged: bool,
    /// Remote CQ data is present.
    pub has_data: bool,
    /// The receiving endpoint at the destination node.
    pub dst_ep: u32,
    /// The sending endpoint at the source node.
    pub src_ep: u32,
    /// The tag (tagged messages).
    pub tag: u64,
    /// The remote CQ data.
    pub data: u64,
    /// The sender's number for a fragmented message (0 for a whole one).
    pub msg_id: u64,
    /// A first fragment: the message's total length; a next one: its offset.
    pub len_or_offset: u64,
    /// The last piece of a write or of a read's answer.
    pub last: bool,
}

const KIND_WHOLE: u8 = 1;
const KIND_FIRST: u8 = 2;
const KIND_NEXT: u8 = 3;
const KIND_WRITE: u8 = 4;
const KIND_READ_REQ: u8 = 5;
const KIND_READ_RESP: u8 = 6;
const KIND_ATOMIC: u8 = 7;
const KIND_ACK: u8 = 8;
const FLAG_TAGGED: u8 = 1;
const FLAG_DATA: u8 = 2;
const FLAG_LAST: u8 = 4;

/// Why a received message was not understood.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Shorter than a header.
    Short,
    /// A kind this build does not know.
    UnknownKind(u8),
    /// Flag bits this build does not know.
    UnknownFlags(u8),
}

impl Header {
    /// Bytes this header takes: [`WHOLE_HEADER_BYTES`] for a whole message, else
    /// [`HEADER_BYTES`].
    pub fn encoded_len(&self) -> usize {
        if self.kind == Kind::Whole {
            WHOLE_HEADER_BYTES
        } else {
            HEADER_BYTES
        }
    }

    /// Write the header into the first [`Header::encoded_len`] bytes of `out`; that length. A whole
    /// message's number and length-or-offset are not sent (they are 0 at the receiver).
    pub fn encode(&self, out: &mut [u8]) -> usize {
        let kind = match self.kind {
            Kind::Whole => KIND_WHOLE,
            Kind::First => KIND_FIRST,
            Kind::Next => KIND_NEXT,
            Kind::Write => KIND_WRITE,
            Kind::ReadReq => KIND_READ_REQ,
            Kind::ReadResp => KIND_READ_RESP,
            Kind::Atomic => KIND_ATOMIC,
            Kind::Ack => KIND_ACK,
        };
        let flags = if self.tagged { FLAG_TAGGED } else { 0 }
            | if self.has_data { FLAG_DATA } else { 0 }
            | if self.last { FLAG_LAST } else { 0 };
        let len = self.encoded_len();
        out[..len].fill(0);
        out[0] = kind;
        out[1] = flags;
        out[4..8].copy_from_slice(&self.dst_ep.to_le_bytes());
        out[8..12].copy_from_slice(&self.src_ep.to_le_bytes());
        out[16..24].copy_from_slice(&self.tag.to_le_bytes());
        out[24..32].copy_from_slice(&self.data.to_le_bytes());
        if len == HEADER_BYTES {
            out[32..40].copy_from_slice(&self.msg_id.to_le_bytes());
            out[40..48].copy_from_slice(&self.len_or_offset.to_le_bytes());
        }
        len
    }

    /// The header of `msg` and its payload.
    pub fn decode(msg: &[u8]) -> Result<(Header, &[u8]), Malformed> {
        if msg.len() < WHOLE_HEADER_BYTES {
            return Err(Malformed::Short);
        }
        let kind = match msg[0] {
            KIND_WHOLE => Kind::Whole,
            KIND_FIRST => Kind::First,
            KIND_NEXT => Kind::Next,
            KIND_WRITE => Kind::Write,
            KIND_READ_REQ => Kind::ReadReq,
            KIND_READ_RESP => Kind::ReadResp,
            KIND_ATOMIC => Kind::Atomic,
            KIND_ACK => Kind::Ack,
            k => return Err(Malformed::UnknownKind(k)),
        };
        let flags = msg[1];
        if flags & !(FLAG_TAGGED | FLAG_DATA | FLAG_LAST) != 0 {
            return Err(Malformed::UnknownFlags(flags));
        }
        let len = if kind == Kind::Whole { WHOLE_HEADER_BYTES } else { HEADER_BYTES };
        if msg.len() < len {
            return Err(Malformed::Short);
        }
        let u32_at = |i: usize| u32::from_le_bytes(msg[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(msg[i..i + 8].try_into().expect("8 bytes"));
        let long = |i: usize| if len == HEADER_BYTES { u64_at(i) } else { 0 };
        let h = Header {
            kind,
            tagged: flags & FLAG_TAGGED != 0,
            has_data: flags & FLAG_DATA != 0,
            dst_ep: u32_at(4),
            src_ep: u32_at(8),
            tag: u64_at(16),
            data: u64_at(24),
            msg_id: long(32),
            len_or_offset: long(40),
            last: flags & FLAG_LAST != 0,
        };
        Ok((h, &msg[len..]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that every header field survives encoding and decoding (a whole message's short
    // header carries no number and no length or offset: they come back 0), that the payload
    // starts right after each kind's header, and that a message shorter than its kind's header,
    // an unknown kind and unknown flag bits are refused rather than guessed at.
    #[test]
    fn headers_round_trip_and_bad_ones_are_refused() {
        let h = Header {
            kind: Kind::First,
            tagged: true,
            has_data: true,
            dst_ep: 7,
            src_ep: u32::MAX,
            tag: 0xdead_beef_0123_4567,
            data: 42,
            msg_id: 9,
            len_or_offset: 1 << 40,
            last: true,
        };
        let mut buf = vec![0u8; HEADER_BYTES + 3];
        assert_eq!(h.encode(&mut buf), HEADER_BYTES);
        buf[HEADER_BYTES..].copy_from_slice(b"abc");
        assert_eq!(Header::decode(&buf), Ok((h, &b"abc"[..])));
        assert_eq!(Header::decode(&buf[..HEADER_BYTES - 1]), Err(Malformed::Short));
        let mut bad = buf.clone();
        bad[0] = 9;
        assert_eq!(Header::decode(&bad), Err(Malformed::UnknownKind(9)));
        bad[0] = 1;
        bad[1] = 0x80;
        assert_eq!(Header::decode(&bad), Err(Malformed::UnknownFlags(0x80)));
        for kind in [Kind::Next, Kind::Write, Kind::ReadReq, Kind::ReadResp, Kind::Atomic, Kind::Ack] {
            let h = Header { kind, last: false, ..h };
            h.encode(&mut buf);
            assert_eq!(Header::decode(&buf).map(|(h, _)| h), Ok(h));
        }

        let whole = Header { kind: Kind::Whole, last: false, ..h };
        let mut buf = vec![0u8; WHOLE_HEADER_BYTES + 3];
        assert_eq!(whole.encode(&mut buf), WHOLE_HEADER_BYTES);
        buf[WHOLE_HEADER_BYTES..].copy_from_slice(b"xyz");
        let sent = Header { msg_id: 0, len_or_offset: 0, ..whole };
        assert_eq!(Header::decode(&buf), Ok((sent, &b"xyz"[..])));
        assert_eq!(Header::decode(&buf[..WHOLE_HEADER_BYTES - 1]), Err(Malformed::Short));
        // A longer kind in a whole message's length is short.
        buf[0] = KIND_NEXT;
        assert_eq!(Header::decode(&buf), Err(Malformed::Short));
    }
}
