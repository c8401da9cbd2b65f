//! Identifiers of regions, and the hashing of them on the data path (a leaf module).

/// A region's id at its owner.
pub type RegionId = u32;

/// Hashes a region id for a map on the data path: one multiplication instead of SipHash.
/// The ids a node maps are the ones it was given (a bounded number per peer), so nothing an
/// outsider sends can pile them into one bucket.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (self.0 ^ u64::from(v)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by region id, hashed with [`IdHasher`].
pub(crate) type RegionMap<V> = std::collections::HashMap<RegionId, V, std::hash::BuildHasherDefault<IdHasher>>;
