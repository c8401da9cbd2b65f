//! The handshake: each end proves it holds the fabric secret over the other's nonce, and the
//! two agree on a frame size both can take.

use rackwire_wire::auth;
use rackwire_wire::payload::HANDSHAKE_LEN;
use rackwire_wire::{FrameKind, HandshakeRepr, HandshakeStep, HEADER_LEN};

use super::CloseReason;
use super::{own_payload_max, Connection, Event, Role, SplitTransmit, State, CLOSE_AUTH};
use crate::Time;

pub(super) const LABEL_ACCEPTOR: &str = "rackwire-edge-acceptor";

pub(super) const LABEL_INITIATOR: &str = "rackwire-edge-initiator";

pub(super) fn context(initiator: u32, acceptor: u32) -> Vec<u8> {
    format!("rackwire-edge {initiator}->{acceptor}").into_bytes()
}

impl Connection {
    pub(super) fn on_handshake(&mut self, now: Time, h: HandshakeRepr) {
        match (self.role, h.step) {
            (Role::Acceptor, HandshakeStep::Hello) => {
                if h.to != self.me || (self.state == State::Established && h.from != self.peer) {
                    return;
                }
                if self.state == State::Established {
                    return;
                }
                self.peer = h.from;
                self.peer_conn = h.conn;
                self.their_nonce = h.nonce;
                self.agree_frame_size(h.mtu);
                self.handshake_next(HandshakeStep::Challenge);
            }
            (Role::Acceptor, HandshakeStep::Proof) => {
                if h.from != self.peer || self.hs_send.is_none() && self.state != State::Established {
                    return;
                }
                if self.state == State::Established {
                    self.handshake_next(HandshakeStep::Done);
                    return;
                }
                let ctx = context(self.peer, self.me);
                if auth::verify(&self.secret, LABEL_INITIATOR, &self.my_nonce, &ctx, &h.proof) {
                    self.established(now);
                    self.handshake_next(HandshakeStep::Done);
                } else {
                    self.close_send = Some(CLOSE_AUTH);
                    self.shut(CloseReason::AuthFailed);
                }
            }
            (Role::Initiator, HandshakeStep::Challenge) => {
                if h.from != self.peer || h.to != self.me {
                    return;
                }
                let ctx = context(self.me, self.peer);
                if !auth::verify(&self.secret, LABEL_ACCEPTOR, &self.my_nonce, &ctx, &h.proof) {
                    self.close_send = Some(CLOSE_AUTH);
                    self.shut(CloseReason::AuthFailed);
                    return;
                }
                self.peer_conn = h.conn;
                self.their_nonce = h.nonce;
                if self.state != State::Established {
                    self.agree_frame_size(h.mtu);
                    self.handshake_next(HandshakeStep::Proof);
                }
            }
            (Role::Initiator, HandshakeStep::Done)
                if h.from == self.peer && self.state == State::Handshaking && self.peer_conn != 0 =>
            {
                self.established(now);
            }
            _ => {}
        }
    }

    /// Frames both ends can take: the smaller of this end's largest and the peer's (the parser
    /// refuses announcements under [`rackwire_wire::payload::FRAME_LEN_MIN`]). Data frames go
    /// out only once established, so every one is cut to the agreed size.
    pub(super) fn agree_frame_size(&mut self, peer_mtu: u16) {
        let own = own_payload_max(&self.cfg);
        self.payload_max = own.min((peer_mtu as usize).saturating_sub(HEADER_LEN));
        // Windows count frames, and were set for frames of this end's own size: smaller agreed
        // frames carry less each, so proportionally more of them keep as many bytes in flight
        // (within the connection's window). Scaled from the configured values, so a repeated
        // handshake step scales once; no data has moved yet.
        let scale = (own + HEADER_LEN) as f64 / (self.payload_max + HEADER_LEN) as f64;
        self.own_windows.scaled(scale, self.cfg.window_frames_max).apply(&mut self.cfg);
        for l in &mut self.links {
            l.reset_window(&self.cfg);
        }
    }

    /// The largest frame this connection sends (after the handshake: what both ends take).
    pub fn frame_max(&self) -> usize {
        self.payload_max + HEADER_LEN
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

    pub(super) fn poll_handshake(&mut self, now: Time, buf: &mut [u8]) -> Option<SplitTransmit> {
        let step = self.hs_send?;
        let waiting_reply = matches!(step, HandshakeStep::Hello | HandshakeStep::Challenge | HandshakeStep::Proof);
        if let Some(last) = self.hs_last {
            if waiting_reply && now < last + self.cfg.handshake_retry_us {
                return None;
            }
        }
        let (proof, nonce) = match step {
            HandshakeStep::Hello => ([0u8; 32], self.my_nonce),
            HandshakeStep::Challenge => (
                auth::prove(&self.secret, LABEL_ACCEPTOR, &self.their_nonce, &context(self.peer, self.me)),
                self.my_nonce,
            ),
            HandshakeStep::Proof => {
                (auth::prove(&self.secret, LABEL_INITIATOR, &self.their_nonce, &context(self.me, self.peer)), [0u8; 32])
            }
            HandshakeStep::Done => ([0u8; 32], [0u8; 32]),
        };
        let h = HandshakeRepr {
            step,
            links: self.links.len() as u8,
            mtu: (own_payload_max(&self.cfg) + HEADER_LEN) as u16,
            from: self.me,
            to: self.peer,
            conn: self.local_conn,
            nonce,
            proof,
        };
        let link = self.hs_rr % self.links.len();
        self.hs_rr += 1;
        if step == HandshakeStep::Done {
            self.hs_send = None;
        } else {
            self.hs_last = Some(now);
        }
        self.emit(now, buf, link, FrameKind::Handshake, 0, HANDSHAKE_LEN, |b| h.emit(b))
    }
}
