//! A session's requests and replies after admission, each authenticated: admission exchanges
//! ephemeral X25519 keys (a node signs both with its node key), HKDF-SHA256 over the
//! Diffie-Hellman secret (salted with the fabric secret, bound to both nonces) gives one
//! HMAC-SHA256 key per direction, and every line carries the MAC of its position in the
//! session and its text. Someone who can send on the management host's network — even holding
//! the fabric secret — cannot inject, alter, replay or reorder a request or a reply.

use ring::hmac;

use crate::auth::{from_hex, to_hex};
use crate::MhError;

/// Hex digits of a line's MAC.
const MAC_HEX: usize = 64;

/// This side's ephemeral key for one admission.
pub(crate) struct Ephemeral {
    key: rackwire_wire::kx::Ephemeral,
    /// Its public half, hex (sent in the hello or the challenge).
    pub public: String,
}

impl Ephemeral {
    pub fn generate() -> Ephemeral {
        let key = rackwire_wire::kx::Ephemeral::generate();
        let public = to_hex(&key.public);
        Ephemeral { key, public }
    }

    /// The session's keys with the other side's public key (hex): `client` says which side
    /// this is. An error for a malformed key.
    pub fn channel(
        mut self,
        theirs: &str,
        secret: &[u8],
        client_nonce: &[u8],
        server_nonce: &[u8],
        client: bool,
    ) -> Result<Channel, MhError> {
        let theirs = from_hex(theirs).ok_or_else(|| MhError::Protocol("bad ephemeral key".into()))?;
        let mut okm = [0u8; 64];
        if !self.key.agree(&theirs, secret, &[b"rackwire-mh-session", client_nonce, server_nonce], &mut okm) {
            return Err(MhError::Protocol("key agreement failed (a bad ephemeral key)".into()));
        }
        let (c2s, s2c) = okm.split_at(32);
        let key = |k: &[u8]| hmac::Key::new(hmac::HMAC_SHA256, k);
        let (tx, rx) = if client { (key(c2s), key(s2c)) } else { (key(s2c), key(c2s)) };
        Ok(Channel { tx, rx, sent: 0, received: 0 })
    }
}

/// One side of an admitted session's authenticated lines.
pub(crate) struct Channel {
    tx: hmac::Key,
    rx: hmac::Key,
    sent: u64,
    received: u64,
}

/// What a line's MAC covers: its position in the session, then its text.
fn message(n: u64, text: &str) -> Vec<u8> {
    [&n.to_le_bytes()[..], text.as_bytes()].concat()
}

impl Channel {
    /// `text` (one line's JSON) as it goes on the wire: its MAC, a space, the text.
    pub fn seal(&mut self, text: &str) -> String {
        let tag = hmac::sign(&self.tx, &message(self.sent, text));
        self.sent += 1;
        format!("{} {text}", to_hex(tag.as_ref()))
    }

    /// The text of a line that arrived, if its MAC holds for the next position.
    pub fn open<'a>(&mut self, line: &'a str) -> Result<&'a str, MhError> {
        let line = line.trim_end_matches(['\n', '\r']);
        let refused = || MhError::Protocol("a line's authentication does not hold".into());
        let (tag, text) = line.split_at_checked(MAC_HEX).ok_or_else(refused)?;
        let text = text.strip_prefix(' ').ok_or_else(refused)?;
        let tag = from_hex(tag).ok_or_else(refused)?;
        hmac::verify(&self.rx, &message(self.received, text), &tag).map_err(|_| refused())?;
        self.received += 1;
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Channel, Channel) {
        let (c, s) = (Ephemeral::generate(), Ephemeral::generate());
        let (cp, sp) = (c.public.clone(), s.public.clone());
        (
            c.channel(&sp, b"secret", b"cn", b"sn", true).unwrap(),
            s.channel(&cp, b"secret", b"cn", b"sn", false).unwrap(),
        )
    }

    // Checks lines go both ways and open at the other side; an altered text, an altered MAC, a
    // replayed line, lines out of order and a line without a MAC are refused.
    #[test]
    fn lines_are_authenticated_in_order() {
        let (mut c, mut s) = pair();
        let l1 = c.seal(r#"{"op":"heartbeat"}"#);
        let l2 = c.seal(r#"{"op":"nodes"}"#);
        assert_eq!(s.open(&l1).unwrap(), r#"{"op":"heartbeat"}"#);
        assert!(s.open(&l1).is_err(), "a replay");
        let altered = l2.replace("nodes", "nodez");
        assert!(s.open(&altered).is_err(), "an altered text");
        assert_eq!(s.open(&l2).unwrap(), r#"{"op":"nodes"}"#);
        let r = s.seal("{}");
        assert_eq!(c.open(&r).unwrap(), "{}");
        let mut bad = c.seal("{}");
        bad.replace_range(0..1, if bad.starts_with('0') { "1" } else { "0" });
        assert!(s.open(&bad).is_err(), "an altered MAC");
        assert!(s.open(r#"{"op":"heartbeat"}"#).is_err(), "no MAC at all");
        let (mut c2, mut s2) = pair();
        let (a, b) = (c2.seal("a"), c2.seal("b"));
        assert!(s2.open(&b).is_err(), "out of order");
        assert_eq!(s2.open(&a).unwrap(), "a");
    }
}
