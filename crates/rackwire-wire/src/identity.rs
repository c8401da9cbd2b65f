//! A node's identity: an Ed25519 key pair. The private half never leaves the node: it is kept
//! as a PKCS#8 document in the node's state directory (readable by its owner only), created on
//! first use and reused on every restart; the public half is what the management host binds
//! to the node's name and id, and what peers check handshake signatures against.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};

/// Bytes of a public key.
pub const PUBLIC_KEY_BYTES: usize = 32;
/// Bytes of a signature.
pub const SIGNATURE_BYTES: usize = 64;
/// The largest key file read (a PKCS#8 Ed25519 document is 83 bytes).
const KEY_FILE_BYTES_MAX: u64 = 4096;

/// A node's public key.
pub type PublicKey = [u8; PUBLIC_KEY_BYTES];

/// Why an identity could not be had.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The key file could not be read or written.
    #[error("key file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        source: std::io::Error,
    },
    /// The key file holds no Ed25519 key pair.
    #[error("key file {0} is not an Ed25519 PKCS#8 key pair")]
    Damaged(String),
    /// The system random source failed.
    #[error("the system random source failed")]
    Random,
    /// The key file, or a folder on its way, is not this user's alone.
    #[error("key file: {0}")]
    NotOwnerOnly(#[from] crate::owner_only::NotOwnerOnly),
}

/// A node's key pair.
pub struct Identity {
    pair: Ed25519KeyPair,
    public: PublicKey,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identity({})", crate::auth::to_hex(&self.public[..8]))
    }
}

impl Identity {
    fn of(pair: Ed25519KeyPair) -> Self {
        let mut public = [0u8; PUBLIC_KEY_BYTES];
        public.copy_from_slice(pair.public_key().as_ref());
        Identity { pair, public }
    }

    /// A fresh key pair, and its PKCS#8 document for keeping.
    pub fn generate() -> Result<(Identity, Vec<u8>), IdentityError> {
        let doc = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).map_err(|_| IdentityError::Random)?;
        let pair = Ed25519KeyPair::from_pkcs8(doc.as_ref()).map_err(|_| IdentityError::Random)?;
        Ok((Identity::of(pair), doc.as_ref().to_vec()))
    }

    /// The key pair whose private key is `seed`: deterministic, for tests and the simulator.
    pub fn from_seed(seed: &[u8; 32]) -> Identity {
        Identity::of(Ed25519KeyPair::from_seed_unchecked(seed).expect("any 32 bytes are an Ed25519 seed"))
    }

    /// The key pair kept at `path`, made (readable by its owner only) if there is none. Two
    /// processes making it at once end up with the same one: the file appears whole, once.
    /// The file and its folders must be this user's alone ([`crate::owner_only`]): a key
    /// another user could have planted or read is refused, not used.
    pub fn load_or_create(path: &Path) -> Result<Identity, IdentityError> {
        use crate::owner_only::{check_file, create_folder, Reach};
        let io = |source| IdentityError::Io { path: path.display().to_string(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            create_folder(dir, Reach::Readable)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(_) => {
                check_file(path)?;
                return Self::parse(path, &read_limited(path).map_err(io)?);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(e)),
        }
        let (id, doc) = Identity::generate()?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = (|| {
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            f.write_all(&doc)?;
            f.sync_all()
        })();
        let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(id),
            // Another process made it first: use theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Self::parse(path, &read_limited(path).map_err(io)?)
            }
            Err(e) => Err(io(e)),
        }
    }

    fn parse(path: &Path, doc: &[u8]) -> Result<Identity, IdentityError> {
        Ed25519KeyPair::from_pkcs8_maybe_unchecked(doc)
            .map(Identity::of)
            .map_err(|_| IdentityError::Damaged(path.display().to_string()))
    }

    /// The public key.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    /// Sign `msg`.
    pub fn sign(&self, msg: &[u8]) -> [u8; SIGNATURE_BYTES] {
        let mut out = [0u8; SIGNATURE_BYTES];
        out.copy_from_slice(self.pair.sign(msg).as_ref());
        out
    }
}

fn read_limited(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut doc = Vec::new();
    std::fs::File::open(path)?.take(KEY_FILE_BYTES_MAX).read_to_end(&mut doc)?;
    Ok(doc)
}

/// Whether `sig` is `public`'s signature of `msg`.
pub fn verify(public: &PublicKey, msg: &[u8], sig: &[u8]) -> bool {
    UnparsedPublicKey::new(&ED25519, public).verify(msg, sig).is_ok()
}

/// A public key from its hex form.
pub fn public_from_hex(s: &str) -> Option<PublicKey> {
    crate::auth::from_hex(s)?.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a signature verifies under its own public key only, and not for another
    // message or with a bit flipped.
    #[test]
    fn signatures_bind_key_and_message() {
        let a = Identity::from_seed(&[1; 32]);
        let b = Identity::from_seed(&[2; 32]);
        let sig = a.sign(b"hello");
        assert!(verify(&a.public(), b"hello", &sig));
        assert!(!verify(&b.public(), b"hello", &sig));
        assert!(!verify(&a.public(), b"hellp", &sig));
        let mut bad = sig;
        bad[10] ^= 1;
        assert!(!verify(&a.public(), b"hello", &bad));
    }

    // Checks that a key file is made once, owner-only, and the same key comes back from it;
    // a damaged file is an error naming it, not a fresh key.
    #[test]
    fn key_file_is_made_once_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("rw-identity-test-{}", std::process::id()));
        let path = dir.join("keys").join("n.key");
        let _ = std::fs::remove_dir_all(&dir);
        let first = Identity::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = Identity::load_or_create(&path).unwrap();
        assert_eq!(first.public(), again.public());
        // A key file others may read (or that another user could have written) is refused,
        // not used (issue: an existing key file was loaded without a look at its mode).
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Identity::load_or_create(&path).unwrap_err();
        assert!(matches!(e, IdentityError::NotOwnerOnly(_)) && e.to_string().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, b"not a key").unwrap();
        assert!(matches!(Identity::load_or_create(&path), Err(IdentityError::Damaged(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
