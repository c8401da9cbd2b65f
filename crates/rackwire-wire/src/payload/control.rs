//! Control payloads: the handshake, link probes and their replies, and close.

use super::*;

/// Steps of the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeStep {
    /// Initiator: who I am, who I want, my nonce.
    Hello,
    /// Acceptor: my nonce, and my proof over yours.
    Challenge,
    /// Initiator: my proof over your nonce.
    Proof,
    /// Acceptor: your proof holds; the connection is up.
    Done,
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
}

/// Bytes of a handshake payload.
pub const HANDSHAKE_LEN: usize = 80;

/// The smallest frame a link may carry: a header, a full segment header and 64 bytes of
/// body. A handshake announcing less is refused.
pub const FRAME_LEN_MIN: usize = crate::frame::HEADER_LEN + SEGMENT_LEN + 64;

impl HandshakeRepr {
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("handshake", HANDSHAKE_LEN, b.len())?;
        if b.len() != HANDSHAKE_LEN {
            return Err(WireError::BadValue { field: "handshake length" });
        }
        let step = match b[0] {
            1 => HandshakeStep::Hello,
            2 => HandshakeStep::Challenge,
            3 => HandshakeStep::Proof,
            4 => HandshakeStep::Done,
            _ => return Err(WireError::BadValue { field: "handshake step" }),
        };
        if b[1] == 0 {
            return Err(WireError::BadValue { field: "handshake links" });
        }
        if (u16::from_be_bytes([b[2], b[3]]) as usize) < FRAME_LEN_MIN {
            return Err(WireError::BadValue { field: "handshake mtu" });
        }
        let mut nonce = [0u8; 32];
        nonce.copy_from_slice(&b[16..48]);
        let mut proof = [0u8; 32];
        proof.copy_from_slice(&b[48..80]);
        Ok(HandshakeRepr {
            step,
            links: b[1],
            mtu: u16::from_be_bytes([b[2], b[3]]),
            from: be32(b, 4),
            to: be32(b, 8),
            conn: be32(b, 12),
            nonce,
            proof,
        })
    }
    /// Write it into [`HANDSHAKE_LEN`] bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = match self.step {
            HandshakeStep::Hello => 1,
            HandshakeStep::Challenge => 2,
            HandshakeStep::Proof => 3,
            HandshakeStep::Done => 4,
        };
        b[1] = self.links;
        b[2..4].copy_from_slice(&self.mtu.to_be_bytes());
        b[4..8].copy_from_slice(&self.from.to_be_bytes());
        b[8..12].copy_from_slice(&self.to.to_be_bytes());
        b[12..16].copy_from_slice(&self.conn.to_be_bytes());
        b[16..48].copy_from_slice(&self.nonce);
        b[48..80].copy_from_slice(&self.proof);
    }
}

/// A link probe, or its reply (same link).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeRepr {
    /// This is the answer to a probe.
    pub reply: bool,
    /// Matches a reply to its probe.
    pub token: u32,
    /// In a reply: the probe's `ts`.
    pub echo_ts: u32,
}

/// Bytes of a probe payload.
pub const PROBE_LEN: usize = 12;

impl ProbeRepr {
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("probe", PROBE_LEN, b.len())?;
        if b.len() != PROBE_LEN || b[0] > 1 {
            return Err(WireError::BadValue { field: "probe" });
        }
        zero(&b[1..4], "probe reserved")?;
        Ok(ProbeRepr { reply: b[0] == 1, token: be32(b, 4), echo_ts: be32(b, 8) })
    }
    /// Write it into [`PROBE_LEN`] bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.reply as u8;
        b[1..4].fill(0);
        b[4..8].copy_from_slice(&self.token.to_be_bytes());
        b[8..12].copy_from_slice(&self.echo_ts.to_be_bytes());
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

impl CloseRepr {
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        need("close", CLOSE_LEN, b.len())?;
        if b.len() != CLOSE_LEN {
            return Err(WireError::BadValue { field: "close length" });
        }
        zero(&b[1..4], "close reserved")?;
        Ok(CloseRepr { reason: b[0] })
    }
    /// Write it into [`CLOSE_LEN`] bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.reason;
        b[1..4].fill(0);
    }
}
