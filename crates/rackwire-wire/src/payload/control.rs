//! Control payloads: the handshake, link probes and their replies, and close.

use super::{be32, zero, SEGMENT_LEN};
use crate::error::{need, WireError};

/// Steps of the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeStep {
    /// Initiator: who I am, who I want, my nonce and ephemeral key.
    Hello,
    /// Acceptor: my nonce and ephemeral key, my proof of the fabric secret over your nonce,
    /// and my node key's signature of the handshake so far.
    Challenge,
    /// Initiator: my proof over your nonce, and my node key's signature of the handshake.
    Proof,
    /// Acceptor: your proof holds; the connection is up.
    Done,
    /// Acceptor, busy with handshakes: nothing kept for your Hello; send it again with this
    /// token (in its proof field), which shows you receive at the address you send from.
    Retry,
}

/// A handshake payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandshakeRepr {
    /// Step.
    pub step: HandshakeStep,
    /// Links the sender has.
    pub links: u8,
    /// The sender's largest frame.
    pub mtu: u16,
    /// Sender's node.
    pub from: u32,
    /// Receiver's node.
    pub to: u32,
    /// The sender's id for this connection (frames to it carry this in `conn`).
    pub conn: u32,
    /// Nonce (Hello, Challenge).
    pub nonce: [u8; 32],
    /// Proof (Challenge, Proof).
    pub proof: [u8; 32],
    /// The sender's ephemeral X25519 public key (Hello, Challenge).
    pub ephemeral: [u8; 32],
    /// The sender's node-key signature of the handshake transcript (Challenge, Proof).
    pub signature: [u8; 64],
    /// The sender wants frames sealed (frames are sealed when either end wants it).
    pub seal: bool,
    /// The sender's message of the password-authenticated key exchange over the fabric
    /// secret (Hello, Challenge; see [`crate::auth::Pake`]).
    pub pake: [u8; crate::auth::PAKE_MSG_BYTES],
}

/// Bytes of a handshake payload.
pub const HANDSHAKE_LEN: usize = 212;

/// The smallest frame a link may carry: a header, a full segment header, 64 bytes of body
/// and a sealed frame's trailer. A handshake announcing less is refused.
pub const FRAME_LEN_MIN: usize = crate::frame::HEADER_LEN + SEGMENT_LEN + 64 + crate::frame::SEALED_TRAILER_LEN;

/// Where a handshake's fields lie.
mod handshake_field {
    use std::ops::Range;
    pub const STEP: usize = 0;
    pub const LINKS: usize = 1;
    pub const MTU: Range<usize> = 2..4;
    pub const FROM: Range<usize> = 4..8;
    pub const TO: Range<usize> = 8..12;
    pub const CONN: Range<usize> = 12..16;
    pub const NONCE: Range<usize> = 16..48;
    pub const PROOF: Range<usize> = 48..80;
    pub const EPHEMERAL: Range<usize> = 80..112;
    pub const SIGNATURE: Range<usize> = 112..176;
    pub const SEAL: usize = 176;
    pub const PAKE: Range<usize> = 177..210;
    pub const RESERVED: Range<usize> = 210..212;
}
const _: () = assert!(handshake_field::RESERVED.end == HANDSHAKE_LEN);

impl HandshakeRepr {
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("handshake", HANDSHAKE_LEN, b.len())?;
        if b.len() != HANDSHAKE_LEN {
            return Err(WireError::BadValue { field: "handshake length" });
        }
        use handshake_field as f;
        let step = match b[f::STEP] {
            1 => HandshakeStep::Hello,
            2 => HandshakeStep::Challenge,
            3 => HandshakeStep::Proof,
            4 => HandshakeStep::Done,
            5 => HandshakeStep::Retry,
            _ => return Err(WireError::BadValue { field: "handshake step" }),
        };
        if b[f::LINKS] == 0 {
            return Err(WireError::BadValue { field: "handshake links" });
        }
        let mtu = u16::from_be_bytes([b[f::MTU.start], b[f::MTU.start + 1]]);
        if (mtu as usize) < FRAME_LEN_MIN {
            return Err(WireError::BadValue { field: "handshake mtu" });
        }
        let mut nonce = [0u8; 32];
        nonce.copy_from_slice(&b[f::NONCE]);
        let mut proof = [0u8; 32];
        proof.copy_from_slice(&b[f::PROOF]);
        let mut ephemeral = [0u8; 32];
        ephemeral.copy_from_slice(&b[f::EPHEMERAL]);
        let mut signature = [0u8; 64];
        signature.copy_from_slice(&b[f::SIGNATURE]);
        if b[f::SEAL] > 1 {
            return Err(WireError::BadValue { field: "handshake seal" });
        }
        zero(&b[f::RESERVED], "handshake reserved")?;
        let mut pake = [0u8; crate::auth::PAKE_MSG_BYTES];
        pake.copy_from_slice(&b[f::PAKE]);
        Ok(HandshakeRepr {
            step,
            links: b[f::LINKS],
            mtu,
            from: be32(b, f::FROM.start),
            to: be32(b, f::TO.start),
            conn: be32(b, f::CONN.start),
            nonce,
            proof,
            ephemeral,
            signature,
            seal: b[f::SEAL] == 1,
            pake,
        })
    }
    /// Write it into [`HANDSHAKE_LEN`] bytes.
    pub fn emit(&self, b: &mut [u8]) {
        use handshake_field as f;
        b[f::STEP] = match self.step {
            HandshakeStep::Hello => 1,
            HandshakeStep::Challenge => 2,
            HandshakeStep::Proof => 3,
            HandshakeStep::Done => 4,
            HandshakeStep::Retry => 5,
        };
        b[f::LINKS] = self.links;
        b[f::MTU].copy_from_slice(&self.mtu.to_be_bytes());
        b[f::FROM].copy_from_slice(&self.from.to_be_bytes());
        b[f::TO].copy_from_slice(&self.to.to_be_bytes());
        b[f::CONN].copy_from_slice(&self.conn.to_be_bytes());
        b[f::NONCE].copy_from_slice(&self.nonce);
        b[f::PROOF].copy_from_slice(&self.proof);
        b[f::EPHEMERAL].copy_from_slice(&self.ephemeral);
        b[f::SIGNATURE].copy_from_slice(&self.signature);
        b[f::SEAL] = self.seal as u8;
        b[f::PAKE].copy_from_slice(&self.pake);
        b[f::RESERVED].fill(0);
    }
}

/// A link probe, or its reply (same link). Its payload may run on past [`PROBE_LEN`] with
/// zeros: a probe padded to a frame length asks whether the path carries frames that long,
/// and its reply, padded to the same length, says it does both ways (see `rackwire_proto`'s
/// path frame size).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeRepr {
    /// This is the answer to a probe.
    pub reply: bool,
    /// Matches a reply to its probe.
    pub token: u32,
    /// In a reply: the probe's `ts`.
    pub echo_ts: u32,
}

/// Bytes of a probe payload before its padding.
pub const PROBE_LEN: usize = 12;

/// Where a probe's fields lie.
mod probe_field {
    use std::ops::Range;
    pub const REPLY: usize = 0;
    pub const RESERVED: Range<usize> = 1..4;
    pub const TOKEN: Range<usize> = 4..8;
    pub const ECHO_TS: Range<usize> = 8..12;
}
const _: () = assert!(probe_field::ECHO_TS.end == PROBE_LEN);

impl ProbeRepr {
    /// Parse a probe payload (padding included: all of `b` past [`PROBE_LEN`] must be zero).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("probe", PROBE_LEN, b.len())?;
        use probe_field as f;
        if b[f::REPLY] > 1 {
            return Err(WireError::BadValue { field: "probe" });
        }
        zero(&b[f::RESERVED], "probe reserved")?;
        zero(&b[PROBE_LEN..], "probe padding")?;
        Ok(ProbeRepr { reply: b[f::REPLY] == 1, token: be32(b, f::TOKEN.start), echo_ts: be32(b, f::ECHO_TS.start) })
    }
    /// Write it into `b` (at least [`PROBE_LEN`] bytes), zeros after it to the end of `b`.
    pub fn emit(&self, b: &mut [u8]) {
        use probe_field as f;
        b[f::REPLY] = self.reply as u8;
        b[f::RESERVED].fill(0);
        b[f::TOKEN].copy_from_slice(&self.token.to_be_bytes());
        b[f::ECHO_TS].copy_from_slice(&self.echo_ts.to_be_bytes());
        b[PROBE_LEN..].fill(0);
    }
}

/// The connection ends, with a reason code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloseRepr {
    /// Reason (0: normal close).
    pub reason: u8,
}

/// Bytes of a close payload.
pub const CLOSE_LEN: usize = 4;

/// Where a close's fields lie.
mod close_field {
    use std::ops::Range;
    pub const REASON: usize = 0;
    pub const RESERVED: Range<usize> = 1..4;
}
const _: () = assert!(close_field::RESERVED.end == CLOSE_LEN);

impl CloseRepr {
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("close", CLOSE_LEN, b.len())?;
        if b.len() != CLOSE_LEN {
            return Err(WireError::BadValue { field: "close length" });
        }
        zero(&b[close_field::RESERVED], "close reserved")?;
        Ok(CloseRepr { reason: b[close_field::REASON] })
    }
    /// Write it into [`CLOSE_LEN`] bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[close_field::REASON] = self.reason;
        b[close_field::RESERVED].fill(0);
    }
}
