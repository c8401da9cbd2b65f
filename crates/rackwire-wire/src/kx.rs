//! Ephemeral key agreement, as both handshakes (the edge transport's and the management
//! host's admission) use it: an X25519 key pair for one handshake, and from the other side's
//! public key, keys through HKDF-SHA256 salted with the fabric secret and bound to what the
//! handshake agreed on.

use ring::agreement::{self, EphemeralPrivateKey, UnparsedPublicKey, X25519};
use ring::hkdf;
use ring::rand::SystemRandom;

/// Bytes of a public key.
pub const PUBLIC_BYTES: usize = 32;

/// An ephemeral X25519 key for one handshake; it agrees once.
pub struct Ephemeral {
    private: Option<EphemeralPrivateKey>,
    /// Its public half, sent in the handshake.
    pub public: [u8; PUBLIC_BYTES],
}

impl std::fmt::Debug for Ephemeral {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ephemeral").field("used", &self.private.is_none()).finish()
    }
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl Ephemeral {
    /// A fresh key.
    pub fn generate() -> Ephemeral {
        let private =
            EphemeralPrivateKey::generate(&X25519, &SystemRandom::new()).expect("the system random source works");
        let mut public = [0u8; PUBLIC_BYTES];
        public.copy_from_slice(private.compute_public_key().expect("an X25519 key has a public half").as_ref());
        Ephemeral { private: Some(private), public }
    }

    /// Fill `out` with keys from the Diffie-Hellman secret with `theirs`, through HKDF-SHA256
    /// salted with `secret` and bound to `info`. False (nothing filled) if this key agreed
    /// already or `theirs` is not a valid X25519 public key.
    pub fn agree(&mut self, theirs: &[u8], secret: &[u8], info: &[&[u8]], out: &mut [u8]) -> bool {
        let Some(private) = self.private.take() else { return false };
        let peer = UnparsedPublicKey::new(&X25519, theirs);
        agreement::agree_ephemeral(private, &peer, |dh| {
            let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, secret).extract(dh);
            prk.expand(info, Len(out.len())).and_then(|okm| okm.fill(out)).is_ok()
        })
        .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks both sides derive the same keys; another secret or another binding gives other
    // keys; a key agrees once; a malformed public key is refused.
    #[test]
    fn both_sides_agree_and_bindings_matter() {
        let derive = |secret: &[u8], info: &[u8]| {
            let (mut a, mut b) = (Ephemeral::generate(), Ephemeral::generate());
            let (pa, pb) = (a.public, b.public);
            let (mut ka, mut kb) = ([0u8; 48], [0u8; 48]);
            assert!(a.agree(&pb, b"s", &[b"x"], &mut ka) && b.agree(&pa, secret, &[info], &mut kb));
            assert!(!a.agree(&pb, b"s", &[b"x"], &mut ka), "a key agrees once");
            (ka, kb)
        };
        let (ka, kb) = derive(b"s", b"x");
        assert_eq!(ka, kb);
        let (ka, kb) = derive(b"other", b"x");
        assert_ne!(ka, kb);
        let (ka, kb) = derive(b"s", b"y");
        assert_ne!(ka, kb);
        assert!(!Ephemeral::generate().agree(&[1, 2, 3], b"s", &[], &mut [0u8; 16]));
    }
}
