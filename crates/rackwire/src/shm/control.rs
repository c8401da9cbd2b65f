//! The control protocol between two nodes that share memory: its messages on the Unix
//! socket (with descriptors beside them), and the rings each side offers the other.

use super::{
    from_hex, BorrowedFd, ControlSocket, Deserialize, DoorbellRemote, Error, MapAccess, Node, NodeId, OwnedFd,
    RegionId, RingReceiver, RingSender, Serialize, SharedMem, MESSAGE_RING_BYTES, NOTIFY_RING_BYTES,
};

/// Ring record kinds: a message, a notification.
pub(super) const KIND_MESSAGE: u32 = 1;
pub(super) const KIND_NOTIFY: u32 = 2;

/// Notification payload: region u32, reserved u32, offset u64, length u64, immediate u64, and
/// 16 reserved bytes that make a record (with its 16-byte header) exactly one cache line.
pub(super) const NOTIFY_RECORD_BYTES: usize = 48;

const _: () = assert!(rackwire_shm::ring::record_bytes(NOTIFY_RECORD_BYTES as u64) == 64);

/// What each end of a shared-memory handshake signs with its node key (labelled by its
/// role), and confirms with the key of the exchange over the secret: both node ids, both
/// nonces and both exchange messages.
pub(super) struct Transcript<'a> {
    pub(super) initiator: NodeId,
    pub(super) acceptor: NodeId,
    pub(super) i_nonce: &'a [u8],
    pub(super) a_nonce: &'a [u8],
    pub(super) i_pake: &'a [u8],
    pub(super) a_pake: &'a [u8],
}

impl Transcript<'_> {
    pub(super) fn bytes(&self, label: &str) -> Vec<u8> {
        [
            label.as_bytes(),
            &[0],
            b"rackwire-shm-handshake-v2",
            &self.initiator.to_be_bytes(),
            &self.acceptor.to_be_bytes(),
            self.i_nonce,
            self.a_nonce,
            self.i_pake,
            self.a_pake,
        ]
        .concat()
    }
}

/// Whether `signature` (hex) is `key`'s signature of `msg`.
pub(super) fn signed_by(key: &rackwire_mh::identity::PublicKey, msg: &[u8], signature: &str) -> bool {
    from_hex(signature).is_some_and(|sig| rackwire_mh::identity::verify(key, msg, &sig))
}

/// Control messages between two nodes that share memory.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub(super) enum PeerMsg {
    /// The initiator's nonce and its message of the exchange over the fabric secret
    /// ([`rackwire_mh::auth::Pake`]).
    Hello {
        from: NodeId,
        to: NodeId,
        nonce: String,
        pake: String,
    },
    /// The acceptor's nonce, its message of the exchange, its confirmation of the exchange's
    /// key over the [`Transcript`], and its node key's signature of it.
    Challenge {
        nonce: String,
        pake: String,
        proof: String,
        signature: String,
    },
    /// The initiator's confirmation and its node key's signature.
    Proof {
        proof: String,
        signature: String,
    },
    /// Carries four descriptors: message ring, notification ring, doorbell page, doorbell eventfd.
    Rings,
    Refused {
        reason: String,
    },
    MapRequest {
        req: u64,
        region: RegionId,
        key: String,
        want: u8,
    },
    /// Carries the region's descriptor.
    MapGranted {
        req: u64,
        access: u8,
    },
    MapRefused {
        req: u64,
        /// The refusal's code and detail ([`Refusal::code`], [`Refusal::detail`]).
        code: u8,
        detail: u64,
    },
    /// The region is served by its owner ([`crate::Fabric::alloc_served`]): ask for each
    /// operation with [`PeerMsg::Served`].
    MapServed {
        req: u64,
    },
    /// An operation on a served region, its data (a write's) after the message.
    Served {
        req: u64,
        region: RegionId,
        key: String,
        op: ServedOp,
    },
    /// The owner's answer: refusal code 0 for done (else [`Refusal::code`] and detail), the
    /// old value of an atomic, a read's data after the message.
    ServedDone {
        req: u64,
        code: u8,
        detail: u64,
        value: u64,
    },
    Unmap {
        region: RegionId,
        seq: u64,
    },
    UnmapAck {
        seq: u64,
    },
}

/// An operation on a served region, as asked of its owner.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub(super) enum ServedOp {
    /// Place the data at `at`: one piece of a write spanning `offset..offset + len`.
    Write { offset: u64, len: u64, at: u64 },
    /// Place the data at `offset`, then set (`add` false) or add `value` at `signal`.
    WriteSignal { offset: u64, signal: u64, add: bool, value: u64 },
    /// Send back `len` bytes at `offset`.
    Read { offset: u64, len: u64 },
    /// Compare-and-swap at `offset`.
    CompareSwap { offset: u64, expected: u64, new: u64 },
    /// Fetch-and-add at `offset`.
    FetchAdd { offset: u64, add: u64 },
}

/// The byte between a control message and the data that follows it (a served operation's):
/// JSON text never holds a raw NUL.
const PAYLOAD_MARK: u8 = 0;

/// The most data one control message carries after its header: a served operation larger
/// than this goes as several.
pub(super) const PAYLOAD_BYTES_MAX: usize = 60 * 1024;

const _: () = assert!(PAYLOAD_BYTES_MAX + 1024 <= rackwire_shm::CONTROL_MSG_BYTES_MAX);

pub(super) fn send(sock: &ControlSocket, msg: &PeerMsg, fds: &[BorrowedFd<'_>]) -> Result<(), Error> {
    send_with(sock, msg, None, fds)
}

/// [`send`] with `payload` (at most [`PAYLOAD_BYTES_MAX`] bytes) after the message.
pub(super) fn send_with(
    sock: &ControlSocket,
    msg: &PeerMsg,
    payload: Option<&[u8]>,
    fds: &[BorrowedFd<'_>],
) -> Result<(), Error> {
    let mut bytes = serde_json::to_vec(msg).map_err(|e| Error::Protocol(e.to_string()))?;
    if let Some(p) = payload {
        if p.len() > PAYLOAD_BYTES_MAX {
            return Err(Error::Protocol(format!("control payload of {} bytes over {PAYLOAD_BYTES_MAX}", p.len())));
        }
        bytes.push(PAYLOAD_MARK);
        bytes.extend_from_slice(p);
    }
    sock.send(&bytes, fds).map_err(|e| Error::sys("sending on a control socket", &e))
}

/// A control message without data after it.
pub(super) fn recv(sock: &ControlSocket, buf: &mut [u8]) -> Result<(PeerMsg, Vec<OwnedFd>), Error> {
    match recv_with(sock, buf)? {
        (msg, fds, None) => Ok((msg, fds)),
        (msg, ..) => Err(Error::Protocol(format!("unexpected data after control message {msg:?}"))),
    }
}

/// A received control message, its descriptors, and where the data after it lies in the
/// receive buffer, if any.
pub(super) type Received = (PeerMsg, Vec<OwnedFd>, Option<std::ops::Range<usize>>);

/// A control message with the data after it.
pub(super) fn recv_with(sock: &ControlSocket, buf: &mut [u8]) -> Result<Received, Error> {
    let (n, fds) = sock.recv(buf).map_err(|e| Error::sys("receiving on a control socket", &e))?;
    if n == 0 {
        return Err(Error::Protocol("peer closed the connection".into()));
    }
    let (text, payload) = match buf[..n].iter().position(|&b| b == PAYLOAD_MARK) {
        Some(i) => (&buf[..i], Some(i + 1..n)),
        None => (&buf[..n], None),
    };
    let msg = serde_json::from_slice(text).map_err(|e| Error::Protocol(format!("malformed control message: {e}")))?;
    Ok((msg, fds, payload))
}

/// Our receive side of a connection: rings the peer will write into.
pub(super) struct LocalRings {
    pub(super) msg: RingReceiver,
    pub(super) notify: RingReceiver,
}

impl LocalRings {
    pub(super) fn new() -> Result<Self, Error> {
        Ok(LocalRings {
            msg: RingReceiver::create("rackwire-msg-ring", MESSAGE_RING_BYTES)?,
            notify: RingReceiver::create("rackwire-notify-ring", NOTIFY_RING_BYTES)?,
        })
    }

    pub(super) fn offer(&self, sock: &ControlSocket, f: &Node) -> Result<(), Error> {
        let [page, efd] = f.doorbell.fds();
        send(sock, &PeerMsg::Rings, &[self.msg.mem().fd(), self.notify.mem().fd(), page, efd])
    }
}

/// Our send side: the peer's rings and doorbell, from the descriptors it sent.
pub(super) struct RemoteRings {
    pub(super) msg: RingSender,
    pub(super) notify: RingSender,
    pub(super) bell: DoorbellRemote,
}

impl RemoteRings {
    pub(super) fn take(msg: PeerMsg, fds: Vec<OwnedFd>) -> Result<Self, Error> {
        match msg {
            PeerMsg::Rings => {}
            PeerMsg::Refused { reason } => {
                return Err(Error::Protocol(format!("peer refused the connection: {reason}")))
            }
            other => return Err(Error::Protocol(format!("expected rings, got {other:?}"))),
        }
        let [m, n, page, efd]: [OwnedFd; 4] =
            fds.try_into().map_err(|_| Error::Protocol("rings need four descriptors".into()))?;
        let ring = |fd| -> Result<RingSender, Error> {
            Ok(RingSender::attach(SharedMem::from_fd(fd, MapAccess::ReadWrite)?)?)
        };
        Ok(RemoteRings { msg: ring(m)?, notify: ring(n)?, bell: DoorbellRemote::attach(page, efd)? })
    }
}

/// What names the exchange over the secret between `initiator` and `acceptor`.
pub(super) fn context(initiator: NodeId, acceptor: NodeId) -> Vec<u8> {
    format!("rackwire-shm {initiator}->{acceptor}").into_bytes()
}

/// The labels of the two ends' confirmations.
pub(super) const CONFIRM_ACCEPTOR: &str = "rackwire-peer-acceptor";
pub(super) const CONFIRM_INITIATOR: &str = "rackwire-peer-initiator";

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the framing of data after a control message: a served write's bytes (holding
    // NULs, JSON-looking text) come back exactly and apart from the message; a message without
    // data has none; `recv` (for messages that never carry data) refuses one that does, and
    // data over the limit is refused before it is sent.
    #[test]
    fn data_after_a_control_message_is_framed_exactly() {
        let (a, b) = ControlSocket::pair().unwrap();
        let mut buf = vec![0u8; rackwire_shm::CONTROL_MSG_BYTES_MAX];
        let op = ServedOp::Write { offset: 8, len: 5, at: 8 };
        let msg = PeerMsg::Served { req: 7, region: 3, key: "00".repeat(16), op };
        let data = b"\0{\"t\":\0}";
        send_with(&a, &msg, Some(data), &[]).unwrap();
        let (got, _, payload) = recv_with(&b, &mut buf).unwrap();
        assert!(matches!(got, PeerMsg::Served { req: 7, region: 3, .. }), "{got:?}");
        assert_eq!(&buf[payload.unwrap()], data);

        send(&a, &PeerMsg::UnmapAck { seq: 1 }, &[]).unwrap();
        assert!(recv_with(&b, &mut buf).unwrap().2.is_none());

        send_with(&a, &PeerMsg::UnmapAck { seq: 2 }, Some(b"x"), &[]).unwrap();
        assert!(matches!(recv(&b, &mut buf), Err(Error::Protocol(m)) if m.contains("unexpected data")));

        let big = vec![1u8; PAYLOAD_BYTES_MAX + 1];
        assert!(matches!(send_with(&a, &msg, Some(&big), &[]), Err(Error::Protocol(_))));
    }
}
