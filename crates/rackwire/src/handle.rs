//! Remote region handles: what an application passes around to name memory on another node.

use std::fmt;
use std::str::FromStr;

use crate::id::RegionId;
use crate::{Error, NodeId};

/// Bytes of a serialised [`RemoteRegion`].
pub const REMOTE_REGION_BYTES: usize = 36;
const MAGIC: [u8; 4] = *b"RWR\x01";
const TEXT_PREFIX: &str = "rw1";

/// A handle to a region on some node: (node, region id, 128-bit key, length).
///
/// The key is random and unguessable; the owner refuses any access whose key does not match.
/// A handle is not a permission: the owner must also have granted the accessing node.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    pub(crate) node: NodeId,
    pub(crate) region: RegionId,
    pub(crate) key: u128,
    pub(crate) len: u64,
}

impl RemoteRegion {
    /// Assemble a handle from its parts (as carried by another protocol).
    pub fn from_parts(node: NodeId, region: RegionId, key: u128, len: u64) -> Self {
        RemoteRegion { node, region, key, len }
    }
    /// Owner node.
    pub fn node(&self) -> NodeId {
        self.node
    }
    /// Region id at the owner.
    pub fn region(&self) -> RegionId {
        self.region
    }
    /// The key.
    pub fn key(&self) -> u128 {
        self.key
    }
    /// Length in bytes, as the owner announced it.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True for a zero-length handle (never made by an owner).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Serialise to [`REMOTE_REGION_BYTES`] bytes (little-endian fields after a magic).
    pub fn to_bytes(&self) -> [u8; REMOTE_REGION_BYTES] {
        let mut b = [0u8; REMOTE_REGION_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&self.node.to_le_bytes());
        b[8..12].copy_from_slice(&self.region.to_le_bytes());
        b[12..20].copy_from_slice(&self.len.to_le_bytes());
        b[20..36].copy_from_slice(&self.key.to_le_bytes());
        b
    }

    /// Parse what [`RemoteRegion::to_bytes`] made.
    #[inline]
    pub fn from_bytes(b: &[u8]) -> Result<Self, Error> {
        if b.len() != REMOTE_REGION_BYTES {
            return Err(Error::BadHandle(format!("{} bytes, expected {REMOTE_REGION_BYTES}", b.len())));
        }
        if b[0..4] != MAGIC {
            return Err(Error::BadHandle("bad magic or version".into()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(RemoteRegion {
            node: u32_at(4),
            region: u32_at(8),
            len: u64::from_le_bytes(b[12..20].try_into().expect("8 bytes")),
            key: u128::from_le_bytes(b[20..36].try_into().expect("16 bytes")),
        })
    }

    pub(crate) fn key_hex(&self) -> String {
        format!("{:032x}", self.key)
    }
}

impl fmt::Display for RemoteRegion {
    /// `rw1:NODE:REGION:LEN:KEY`, numbers in decimal, key in 32 hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TEXT_PREFIX}:{}:{}:{}:{:032x}", self.node, self.region, self.len, self.key)
    }
}

impl fmt::Debug for RemoteRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key is a capability: keep it out of logs.
        write!(f, "RemoteRegion(node {}, region {}, {} bytes)", self.node, self.region, self.len)
    }
}

impl FromStr for RemoteRegion {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad =
            |what: &str| Error::BadHandle(format!("{what} in {s:?} (expected {TEXT_PREFIX}:NODE:REGION:LEN:KEY)"));
        let parts: Vec<&str> = s.trim().split(':').collect();
        let [prefix, node, region, len, key] = parts[..] else {
            return Err(bad("wrong number of fields"));
        };
        if prefix != TEXT_PREFIX {
            return Err(bad("unknown prefix"));
        }
        if key.len() != 32 {
            return Err(bad("key is not 32 hex digits"));
        }
        Ok(RemoteRegion {
            node: node.parse().map_err(|_| bad("bad node"))?,
            region: region.parse().map_err(|_| bad("bad region"))?,
            len: len.parse().map_err(|_| bad("bad length"))?,
            key: u128::from_str_radix(key, 16).map_err(|_| bad("bad key"))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // Checks that bytes and text forms round-trip every handle exactly.
        #[test]
        fn round_trips(node: u32, region: u32, key: u128, len: u64) {
            let h = RemoteRegion { node, region, key, len };
            prop_assert_eq!(RemoteRegion::from_bytes(&h.to_bytes()).unwrap(), h);
            prop_assert_eq!(h.to_string().parse::<RemoteRegion>().unwrap(), h);
        }

        // Checks that parsing arbitrary text or bytes never panics (errors are fine).
        #[test]
        fn parse_never_panics(s in ".{0,80}", b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = s.parse::<RemoteRegion>();
            let _ = RemoteRegion::from_bytes(&b);
        }
    }

    // Checks that malformed handles get a BadHandle error naming the problem.
    #[test]
    fn malformed_handles_are_refused() {
        assert!(matches!("rw1:1:2:3".parse::<RemoteRegion>(), Err(Error::BadHandle(_))));
        assert!(matches!(
            "xx1:1:2:3:00000000000000000000000000000000".parse::<RemoteRegion>(),
            Err(Error::BadHandle(_))
        ));
        assert!(matches!("rw1:1:2:3:0000".parse::<RemoteRegion>(), Err(Error::BadHandle(_))));
        let mut b = RemoteRegion::from_parts(1, 2, 3, 4).to_bytes();
        b[3] = 9;
        assert!(matches!(RemoteRegion::from_bytes(&b), Err(Error::BadHandle(_))));
    }
}
