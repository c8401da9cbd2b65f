//! Node identities for the simulator and the tests: node `n`'s key pair is made from a seed
//! derived from `n`, so every run (and both ends of a test) agree on every node's key.

use std::sync::Arc;

use rackwire_proto::Credentials;
use rackwire_wire::identity::{Identity, PublicKey};

/// Node `node`'s key pair.
pub fn identity(node: u32) -> Arc<Identity> {
    let mut seed = [0x5eu8; 32];
    seed[..4].copy_from_slice(&node.to_be_bytes());
    Arc::new(Identity::from_seed(&seed))
}

/// Node `node`'s public key.
pub fn public_key(node: u32) -> PublicKey {
    identity(node).public()
}

/// Node `node`'s credentials with the fabric secret `secret`, frames sealed.
pub fn credentials(node: u32, secret: &[u8]) -> Credentials {
    Credentials::new(secret, identity(node))
}

/// The same, frames unsealed (both ends must say so): for tests that forge or inspect frames.
pub fn unsealed(node: u32, secret: &[u8]) -> Credentials {
    Credentials { seal: false, ..credentials(node, secret) }
}
