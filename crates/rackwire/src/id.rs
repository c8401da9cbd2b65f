//! Identifiers of regions (a leaf module).

/// A region's id at its owner.
pub type RegionId = u32;
