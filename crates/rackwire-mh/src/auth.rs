//! Shared-secret proofs (see `rackwire_wire::auth`) and the system randomness they need.

pub use rackwire_wire::auth::*;

/// A fresh random nonce.
pub fn nonce() -> [u8; NONCE_BYTES] {
    let mut n = [0u8; NONCE_BYTES];
    getrandom::fill(&mut n).expect("the system random source works");
    n
}

/// 16 random bytes, for unguessable keys.
pub fn random_u128() -> u128 {
    let mut n = [0u8; 16];
    getrandom::fill(&mut n).expect("the system random source works");
    u128::from_le_bytes(n)
}
