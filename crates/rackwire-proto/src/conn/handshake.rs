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

/// The label of the acceptor's confirmation in its Done: the initiator takes the handshake as
/// finished only from the peer.
const LABEL_DONE: &str = "rackwire-edge-done";

/// The peer's part of the transcript, as a handshake frame states it.
struct PeerPart {
    conn: u32,
    nonce: [u8; 32],
    ephemeral: [u8; 32],
    pake: [u8; auth::PAKE_MSG_BYTES],
    seal: bool,
}

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
    /// Answers in the peer's name that did not prove it (a Challenge not signed by its key, a
    /// Proof without the exchange's key): forged, or the peer's own with the wrong key or
    /// secret. A handshake that runs out of time after one ends as refused, not as silent.
    pub(super) bad_answers: u32,
    /// The token a busy acceptor's Retry gave, sent back in the Hello's proof field.
    retry_token: Option<[u8; 32]>,
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
            bad_answers: 0,
            retry_token: None,
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
        self.transcript_with(&PeerPart {
            conn: self.peer_conn,
            nonce: self.their_nonce,
            ephemeral: self.hs.their_ephemeral,
            pake: self.hs.their_pake,
            seal: self.hs.their_seal,
        })
    }

    /// The transcript with the peer's part as a handshake frame states it (before it is
    /// adopted: a frame is checked against what it would agree to before anything changes).
    fn transcript_with(&self, theirs: &PeerPart) -> Vec<u8> {
        let (i, a) = match self.role {
            Role::Initiator => (self.me, self.peer),
            Role::Acceptor => (self.peer, self.me),
        };
        let (i_conn, a_conn, i_nonce, a_nonce, i_eph, a_eph, i_seal, a_seal) = match self.role {
            Role::Initiator => (
                self.local_conn,
                theirs.conn,
                &self.my_nonce,
                &theirs.nonce,
                &self.hs.ephemeral.public,
                &theirs.ephemeral,
                self.hs.creds.seal,
                theirs.seal,
            ),
            Role::Acceptor => (
                theirs.conn,
                self.local_conn,
                &theirs.nonce,
                &self.my_nonce,
                &theirs.ephemeral,
                &self.hs.ephemeral.public,
                theirs.seal,
                self.hs.creds.seal,
            ),
        };
        let (i_pake, a_pake) = match self.role {
            Role::Initiator => (&self.hs.my_pake, &theirs.pake),
            Role::Acceptor => (&theirs.pake, &self.hs.my_pake),
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

    /// Whether the peer signed `transcript` with the key known for it.
    fn peer_signed(&self, transcript: &[u8], signature: &[u8; 64]) -> bool {
        let label = if self.role == Role::Initiator { LABEL_ACCEPTOR } else { LABEL_INITIATOR };
        identity::verify(&self.hs.peer_key, &Self::signed(label, transcript), signature)
    }

    /// The peer proved who it is and refused this end (or this end refused it): the
    /// connection ends, telling the peer.
    fn auth_failed(&mut self) {
        self.stats.handshakes_refused += 1;
        self.close_send = Some(CLOSE_AUTH);
        self.shut(CloseReason::AuthFailed);
    }

    /// A handshake step that proves nothing about its sender (anyone who saw the frames in
    /// clear could have made it): ignored and counted, the handshake goes on.
    fn unproven(&mut self) -> bool {
        self.stats.unproven += 1;
        false
    }

    /// [`Connection::unproven`] for an answer in the peer's name that failed its proof.
    fn bad_answer(&mut self) -> bool {
        self.hs.bad_answers = self.hs.bad_answers.saturating_add(1);
        self.unproven()
    }

    /// The handshake ran out of time: refused if answers in the peer's name failed their
    /// proofs (the peer holds another secret or key, or someone forged them; which, this end
    /// cannot tell), silent otherwise.
    pub(super) fn handshake_timed_out(&mut self) {
        if self.hs.bad_answers > 0 {
            self.stats.handshakes_refused += 1;
            self.shut(CloseReason::AuthFailed);
        } else {
            self.shut(CloseReason::IdleTimeout);
        }
    }

    /// A handshake step arrived. Steps come unsealed, so each is checked against what only the
    /// peer can make before it changes anything: a step that does not hold is ignored and
    /// counted ([`ConnStats::unproven`](crate::ConnStats::unproven)), never taken as a refusal
    /// (which would let anyone who saw a connection's id in clear end its handshake). Returns
    /// whether the step proved that the peer sent it.
    pub(super) fn on_handshake(&mut self, now: Time, h: HandshakeRepr) -> bool {
        match (self.role, h.step) {
            (Role::Acceptor, HandshakeStep::Hello) => {
                if h.to != self.me || h.from != self.peer {
                    return self.unproven();
                }
                // A repeated Hello (ours went unanswered, or is on its way): answer again.
                if self.hs.signature.is_some() {
                    if self.state == State::Handshaking && h.conn == self.peer_conn && h.nonce == self.their_nonce {
                        self.handshake_next(HandshakeStep::Challenge);
                    }
                    return false;
                }
                // The Hello that opened this connection (the endpoint opens one per first frame,
                // so a forged Hello only ever reaches a connection of its own).
                self.peer_conn = h.conn;
                self.their_nonce = h.nonce;
                self.hs.their_ephemeral = h.ephemeral;
                self.hs.their_seal = h.seal;
                if !self.hs.finish(h.pake) || !self.agree_keys() {
                    self.auth_failed();
                    return false;
                }
                self.agree_frame_size(h.mtu);
                self.handshake_next(HandshakeStep::Challenge);
                false
            }
            (Role::Acceptor, HandshakeStep::Proof) => {
                if h.from != self.peer || self.hs.signature.is_none() {
                    return self.unproven();
                }
                // Only the initiator holds the key of the exchange: a Proof whose confirmation
                // does not hold is somebody else's.
                let t = self.transcript();
                if !self.hs.confirmed(LABEL_INITIATOR, &t, &h.proof) {
                    return self.bad_answer();
                }
                if self.state == State::Established {
                    // A repeated Proof: our Done was lost.
                    self.handshake_next(HandshakeStep::Done);
                } else if self.peer_signed(&t, &h.signature) {
                    self.established(now);
                    self.handshake_next(HandshakeStep::Done);
                } else {
                    // The initiator itself (it holds the exchange's key) signed with a key that
                    // is not the one on record for the node it claims to be.
                    self.auth_failed();
                }
                true
            }
            (Role::Initiator, HandshakeStep::Challenge) => {
                if h.from != self.peer || h.to != self.me {
                    return self.unproven();
                }
                let theirs =
                    PeerPart { conn: h.conn, nonce: h.nonce, ephemeral: h.ephemeral, pake: h.pake, seal: h.seal };
                let t = self.transcript_with(&theirs);
                if self.hs.signature.is_some() {
                    // A repeated Challenge: our Proof was lost (or is on its way).
                    if self.state == State::Established || h.conn != self.peer_conn || t != self.transcript() {
                        return self.unproven();
                    }
                    self.handshake_next(HandshakeStep::Proof);
                    return false;
                }
                // The peer's signature is checked before the exchange over the secret is finished
                // (which can be done once): a Challenge not signed by the peer's key changes
                // nothing, and the genuine one that follows is taken.
                if !self.peer_signed(&t, &h.signature) {
                    return self.bad_answer();
                }
                self.peer_conn = h.conn;
                self.their_nonce = h.nonce;
                self.hs.their_ephemeral = h.ephemeral;
                self.hs.their_seal = h.seal;
                // Signed by the peer: a confirmation that does not hold now means the two ends
                // hold different secrets, a refusal.
                if !self.hs.finish(h.pake) || !self.hs.confirmed(LABEL_ACCEPTOR, &t, &h.proof) || !self.agree_keys() {
                    self.auth_failed();
                    return true;
                }
                self.agree_frame_size(h.mtu);
                self.handshake_next(HandshakeStep::Proof);
                true
            }
            (Role::Initiator, HandshakeStep::Retry) => {
                // A busy acceptor kept nothing for our Hello: it goes again, with the token (a
                // Retry proves nothing; a forged one costs one Hello, as the real one does).
                let ours = h.from == self.peer && h.to == self.me && h.nonce == self.my_nonce;
                if !ours || self.state != State::Handshaking || self.hs.signature.is_some() {
                    return self.unproven();
                }
                self.hs.retry_token = Some(h.proof);
                self.stats.retries += 1;
                self.handshake_next(HandshakeStep::Hello);
                false
            }
            (Role::Initiator, HandshakeStep::Done) => {
                // Done carries the acceptor's confirmation of the whole exchange: a forged one
                // would make this end send data its peer does not take yet.
                if h.from != self.peer || self.state != State::Handshaking || self.hs.signature.is_none() {
                    return self.unproven();
                }
                if !self.hs.confirmed(LABEL_DONE, &self.transcript(), &h.proof) {
                    return self.unproven();
                }
                self.established(now);
                true
            }
            _ => self.unproven(),
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

    /// Data frames of at most `payload` segment bytes from now on (the path carries no more:
    /// see `path`). Windows count frames, so they grow as much, the links' current ones too
    /// (scaled, not started over: data has moved).
    pub(super) fn shrink_frames(&mut self, payload: usize) {
        if payload >= self.payload_max {
            return;
        }
        let frame = |p: usize| (p + HEADER_LEN + TRAILER_LEN) as f64;
        let step = frame(self.payload_max) / frame(payload);
        let scale = frame(own_payload_max(&self.cfg)) / frame(payload);
        self.payload_max = payload;
        self.own_windows.scaled(scale, self.cfg.window_frames_max).apply(&mut self.cfg);
        for l in &mut self.links {
            l.scale_window(step, &self.cfg);
        }
    }

    /// The largest data frame this connection sends, a sealed frame's trailer included (after
    /// the handshake: what both ends take; shorter once the path proved to carry less, see
    /// [`Connection::agreed_frame_max`]).
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
        self.start_path_search(now);
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
            HandshakeStep::Hello => (self.hs.retry_token.unwrap_or([0u8; 32]), self.my_nonce, self.hs.my_pake),
            HandshakeStep::Challenge => (confirm(LABEL_ACCEPTOR), self.my_nonce, self.hs.my_pake),
            HandshakeStep::Proof => (confirm(LABEL_INITIATOR), [0u8; 32], [0u8; auth::PAKE_MSG_BYTES]),
            HandshakeStep::Done => (confirm(LABEL_DONE), [0u8; 32], [0u8; auth::PAKE_MSG_BYTES]),
            // Sent by an endpoint, never by a connection.
            HandshakeStep::Retry => return None,
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
