//! The handshake: each end proves it holds the fabric secret (a SPAKE2 exchange over it, then
//! an HMAC of the transcript under the key it gave: see [`rackwire_wire::auth`], which is why
//! neither an eavesdropper nor an impostor can test guesses of the secret offline) and that it
//! is the node it claims to be (its node key's signature of the transcript, checked against
//! the key the caller knows for that node), the two agree on a frame size both can take, and,
//! from ephemeral X25519 keys in the first two steps, on the keys that seal every later frame
//! (see [`crate::seal`]).
//!
//! ```text
//! initiator                                   acceptor
//!   Hello     nonce_i, eph_i, seal_i, pake_i   ──▶
//!         ◀──   Challenge  nonce_a, eph_a, seal_a, pake_a, confirm_a(transcript), sig_a(transcript)
//!   Proof     confirm_i(transcript), sig_i(transcript)   ──▶
//!             ◀──   Done
//! ```
//!
//! The transcript holds both node ids, both connection ids, both nonces, both ephemeral keys,
//! both exchange messages and both seal wishes, so nothing in it can be swapped by someone in
//! the middle.

use std::sync::Arc;

use rackwire_wire::auth;
use rackwire_wire::identity::{self, Identity, PublicKey};
use rackwire_wire::payload::HANDSHAKE_LEN;
use rackwire_wire::{FrameKind, HandshakeRepr, HandshakeStep, HEADER_LEN};

use super::CloseReason;
use super::{own_payload_max, Connection, Event, FrameBufs, Role, SplitTransmit, State, CLOSE_AUTH};
use crate::seal::TRAILER_LEN;
use crate::Time;

pub(super) const LABEL_ACCEPTOR: &str = "rackwire-edge-acceptor";

pub(super) const LABEL_INITIATOR: &str = "rackwire-edge-initiator";

/// What a node proves itself with in a handshake.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// The fabric's shared secret.
    pub secret: Vec<u8>,
    /// This node's key pair.
    pub identity: Arc<Identity>,
    /// Whether this end wants frames sealed. Frames are sealed when either end wants it; off
    /// on both ends only to measure what sealing costs.
    pub seal: bool,
}

impl Credentials {
    /// Credentials with sealing on.
    pub fn new(secret: &[u8], identity: Arc<Identity>) -> Self {
        Credentials { secret: secret.to_vec(), identity, seal: true }
    }
}

pub(super) fn context(initiator: u32, acceptor: u32) -> Vec<u8> {
    format!("rackwire-edge {initiator}->{acceptor}").into_bytes()
}

/// The handshake's state beyond the nonces.
#[derive(Debug)]
pub(super) struct Handshake {
    pub(super) creds: Credentials,
    /// The key the caller knows for the peer's node.
    pub(super) peer_key: PublicKey,
    pub(super) ephemeral: rackwire_wire::kx::Ephemeral,
    pub(super) their_ephemeral: [u8; 32],
    pub(super) their_seal: bool,
    /// This end's side of the exchange over the secret, until the peer's message finishes it,
    /// and this end's message (sent again with a repeated step).
    pake: Option<auth::Pake>,
    my_pake: [u8; auth::PAKE_MSG_BYTES],
    their_pake: [u8; auth::PAKE_MSG_BYTES],
    /// The key the exchange gave.
    key: Option<auth::SharedKey>,
    /// This end's signature, once made (sent again with a repeated step).
    pub(super) signature: Option<[u8; 64]>,
}

impl Handshake {
    pub(super) fn new(creds: &Credentials, peer_key: PublicKey, role: Role, me: u32, peer: u32) -> Handshake {
        let (initiator, acceptor) = if role == Role::Initiator { (me, peer) } else { (peer, me) };
        let (pake, my_pake) = auth::Pake::start(&creds.secret, role == Role::Initiator, &context(initiator, acceptor));
        Handshake {
            creds: creds.clone(),
            peer_key,
            ephemeral: rackwire_wire::kx::Ephemeral::generate(),
            their_ephemeral: [0; 32],
            their_seal: false,
            pake: Some(pake),
            my_pake,
            their_pake: [0; auth::PAKE_MSG_BYTES],
            key: None,
            signature: None,
        }
    }

    /// Finish the exchange with the peer's message. False when it is malformed (or the
    /// exchange was finished already).
    fn finish(&mut self, theirs: [u8; auth::PAKE_MSG_BYTES]) -> bool {
        self.their_pake = theirs;
        self.key = self.pake.take().and_then(|p| p.finish(&theirs));
        self.key.is_some()
    }

    /// Whether `proof` is the peer's confirmation, under `label`, of `transcript`.
    fn confirmed(&self, label: &str, transcript: &[u8], proof: &[u8]) -> bool {
        self.key.as_ref().is_some_and(|k| k.check(label, transcript, proof))
    }
}

impl Connection {
    /// The bytes both ends sign: everything the handshake agreed on.
    fn transcript(&self) -> Vec<u8> {
        let (i, a) = match self.role {
            Role::Initiator => (self.me, self.peer),
            Role::Acceptor => (self.peer, self.me),
        };
        let (i_conn, a_conn, i_nonce, a_nonce, i_eph, a_eph, i_seal, a_seal) = match self.role {
            Role::Initiator => (
                self.local_conn,
                self.peer_conn,
                &self.my_nonce,
                &self.their_nonce,
                &self.hs.ephemeral.public,
                &self.hs.their_ephemeral,
                self.hs.creds.seal,
                self.hs.their_seal,
            ),
            Role::Acceptor => (
                self.peer_conn,
                self.local_conn,
                &self.their_nonce,
                &self.my_nonce,
                &self.hs.their_ephemeral,
                &self.hs.ephemeral.public,
                self.hs.their_seal,
                self.hs.creds.seal,
            ),
        };
        let (i_pake, a_pake) = match self.role {
            Role::Initiator => (&self.hs.my_pake, &self.hs.their_pake),
            Role::Acceptor => (&self.hs.their_pake, &self.hs.my_pake),
        };
        let mut t = Vec::with_capacity(200);
        t.extend_from_slice(b"rackwire-edge-handshake-v3");
        for v in [i, a, i_conn, a_conn] {
            t.extend_from_slice(&v.to_be_bytes());
        }
        for b in [i_nonce, a_nonce, i_eph, a_eph] {
            t.extend_from_slice(b);
        }
        t.extend_from_slice(i_pake);
        t.extend_from_slice(a_pake);
        t.extend_from_slice(&[i_seal as u8, a_seal as u8]);
        t
    }

    fn signed(label: &str, transcript: &[u8]) -> Vec<u8> {
        [label.as_bytes(), &[0], transcript].concat()
    }

    /// Derive the frame keys (if either end wants sealing) and sign the transcript.
    fn agree_keys(&mut self) -> bool {
        let t = self.transcript();
        if self.hs.creds.seal || self.hs.their_seal {
            let initiator = self.role == Role::Initiator;
            let their = self.hs.their_ephemeral;
            match crate::seal::keys(&mut self.hs.ephemeral, &their, &self.hs.creds.secret, &t, initiator) {
                Some(k) => self.keys = Some(Box::new(k)),
                None => return false,
            }
        }
        let label = if self.role == Role::Initiator { LABEL_INITIATOR } else { LABEL_ACCEPTOR };
        self.hs.signature = Some(self.hs.creds.identity.sign(&Self::signed(label, &t)));
        true
    }

    /// Whether the peer signed the transcript with the key known for it.
    fn peer_signed(&self, signature: &[u8; 64]) -> bool {
        let label = if self.role == Role::Initiator { LABEL_ACCEPTOR } else { LABEL_INITIATOR };
        identity::verify(&self.hs.peer_key, &Self::signed(label, &self.transcript()), signature)
    }

    fn auth_failed(&mut self) {
        self.stats.handshakes_refused += 1;
        self.close_send = Some(CLOSE_AUTH);
        self.shut(CloseReason::AuthFailed);
    }

    pub(super) fn on_handshake(&mut self, now: Time, h: HandshakeRepr) {
        match (self.role, h.step) {
            (Role::Acceptor, HandshakeStep::Hello) => {
                if h.to != self.me || h.from != self.peer {
                    return;
                }
                // A repeated Hello (ours went unanswered, or is on its way): answer again.
                if self.hs.signature.is_some() {
                    if self.state == State::Handshaking && h.conn == self.peer_conn && h.nonce == self.their_nonce {
                        self.handshake_next(HandshakeStep::Challenge);
                    }
                    return;
                }
                self.peer_conn = h.conn;
                self.their_nonce = h.nonce;
                self.hs.their_ephemeral = h.ephemeral;
                self.hs.their_seal = h.seal;
                if !self.hs.finish(h.pake) || !self.agree_keys() {
                    self.auth_failed();
                    return;
                }
                self.agree_frame_size(h.mtu);
                self.handshake_next(HandshakeStep::Challenge);
            }
            (Role::Acceptor, HandshakeStep::Proof) => {
                if h.from != self.peer || self.hs.signature.is_none() {
                    return;
                }
                if self.state == State::Established {
                    self.handshake_next(HandshakeStep::Done);
                    return;
                }
                if self.hs.confirmed(LABEL_INITIATOR, &self.transcript(), &h.proof) && self.peer_signed(&h.signature) {
                    self.established(now);
                    self.handshake_next(HandshakeStep::Done);
                } else {
                    self.auth_failed();
                }
            }
            (Role::Initiator, HandshakeStep::Challenge) => {
                if h.from != self.peer || h.to != self.me {
                    return;
                }
                if self.hs.signature.is_some() {
                    // A repeated Challenge: our Proof was lost (or is on its way).
                    if self.state != State::Established && h.conn == self.peer_conn {
                        self.handshake_next(HandshakeStep::Proof);
                    }
                    return;
                }
                self.peer_conn = h.conn;
                self.their_nonce = h.nonce;
                self.hs.their_ephemeral = h.ephemeral;
                self.hs.their_seal = h.seal;
                if !self.hs.finish(h.pake)
                    || !self.hs.confirmed(LABEL_ACCEPTOR, &self.transcript(), &h.proof)
                    || !self.peer_signed(&h.signature)
                    || !self.agree_keys()
                {
                    self.auth_failed();
                    return;
                }
                self.agree_frame_size(h.mtu);
                self.handshake_next(HandshakeStep::Proof);
            }
            (Role::Initiator, HandshakeStep::Done)
                if h.from == self.peer && self.state == State::Handshaking && self.hs.signature.is_some() =>
            {
                self.established(now);
            }
            _ => {}
        }
    }

    /// Frames both ends can take: the smaller of this end's largest and the peer's (the parser
    /// refuses announcements under [`rackwire_wire::payload::FRAME_LEN_MIN`]), less the
    /// trailer of a sealed frame. Data frames go out only once established, so every one is
    /// cut to the agreed size.
    pub(super) fn agree_frame_size(&mut self, peer_mtu: u16) {
        let own = own_payload_max(&self.cfg);
        self.payload_max = own.min((peer_mtu as usize).saturating_sub(HEADER_LEN + TRAILER_LEN));
        // Windows count frames, and were set for frames of this end's own size: smaller agreed
        // frames carry less each, so proportionally more of them keep as many bytes in flight
        // (within the connection's window). Scaled from the configured values, so a repeated
        // handshake step scales once; no data has moved yet.
        let frame = |payload: usize| (payload + HEADER_LEN + TRAILER_LEN) as f64;
        let scale = frame(own) / frame(self.payload_max);
        self.own_windows.scaled(scale, self.cfg.window_frames_max).apply(&mut self.cfg);
        for l in &mut self.links {
            l.reset_window(&self.cfg);
        }
    }

    /// The largest frame this connection sends, a sealed frame's trailer included (after the
    /// handshake: what both ends take).
    pub fn frame_max(&self) -> usize {
        self.payload_max + HEADER_LEN + TRAILER_LEN
    }

    /// Whether this connection's frames are sealed (known once the handshake agreed on it).
    pub fn sealed(&self) -> bool {
        self.keys.is_some()
    }

    /// The next handshake frame to send: at once (the retry timer is for repeating a step).
    pub(super) fn handshake_next(&mut self, step: HandshakeStep) {
        self.hs_send = Some(step);
        self.hs_last = None;
    }

    pub(super) fn established(&mut self, now: Time) {
        self.state = State::Established;
        self.hs_send = None;
        for l in &mut self.links {
            l.last_heard = now;
        }
        self.events.push_back(Event::Connected { peer: self.peer });
    }

    pub(super) fn poll_handshake(&mut self, now: Time, bufs: &mut dyn FrameBufs) -> Option<SplitTransmit> {
        let step = self.hs_send?;
        let waiting_reply = matches!(step, HandshakeStep::Hello | HandshakeStep::Challenge | HandshakeStep::Proof);
        if let Some(last) = self.hs_last {
            if waiting_reply && now < last + self.cfg.handshake_retry_us {
                return None;
            }
        }
        let confirm = |label| self.hs.key.as_ref().map_or([0u8; 32], |k| k.confirm(label, &self.transcript()));
        let (proof, nonce, pake) = match step {
            HandshakeStep::Hello => ([0u8; 32], self.my_nonce, self.hs.my_pake),
            HandshakeStep::Challenge => (confirm(LABEL_ACCEPTOR), self.my_nonce, self.hs.my_pake),
            HandshakeStep::Proof => (confirm(LABEL_INITIATOR), [0u8; 32], [0u8; auth::PAKE_MSG_BYTES]),
            HandshakeStep::Done => ([0u8; 32], [0u8; 32], [0u8; auth::PAKE_MSG_BYTES]),
        };
        let signature = match step {
            HandshakeStep::Challenge | HandshakeStep::Proof => self.hs.signature.unwrap_or([0; 64]),
            _ => [0; 64],
        };
        let h = HandshakeRepr {
            step,
            links: self.links.len() as u8,
            mtu: (own_payload_max(&self.cfg) + HEADER_LEN + TRAILER_LEN) as u16,
            from: self.me,
            to: self.peer,
            conn: self.local_conn,
            nonce,
            proof,
            ephemeral: self.hs.ephemeral.public,
            signature,
            seal: self.hs.creds.seal,
            pake,
        };
        let link = self.hs_rr % self.links.len();
        self.hs_rr += 1;
        // The initiator repeats its steps until answered; the acceptor's are answers, sent once
        // per step of the initiator's that arrives (no amplification of a spoofed first frame).
        if step == HandshakeStep::Done || self.role == Role::Acceptor {
            self.hs_send = None;
        } else {
            self.hs_last = Some(now);
        }
        self.emit(now, bufs, link, FrameKind::Handshake, 0, HANDSHAKE_LEN, |b| h.emit(b))
    }
}
