//! Why a target refused an operation, as every transport carries it back.

/// Why the target refused an operation: the one refusal type of every transport. Each travels
/// back to the initiator with its detail (on the wire, a code and a 64-bit detail).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// No grant covers the operation.
    Ungranted {
        /// The access bits the operation needed (0 where the refusing side did not say).
        needed: u8,
    },
    /// The grant was revoked.
    Revoked,
    /// The key does not match the region's.
    BadKey,
    /// No such region.
    UnknownRegion,
    /// The range lies outside the region.
    OutOfBounds {
        /// The region's length (0 where the refusing side did not say).
        region_len: u64,
    },
    /// An atomic at an offset that is not 8-byte aligned.
    Misaligned,
    /// A message larger than the receiver accepts.
    TooLarge,
    /// The region is moving to fresh memory (a peer was cut off): try again shortly.
    Busy,
    /// A code this build does not know.
    Other(u8),
}

impl Refusal {
    /// The code on the wire.
    pub fn code(self) -> u8 {
        match self {
            Refusal::Ungranted { .. } => 1,
            Refusal::Revoked => 2,
            Refusal::BadKey => 3,
            Refusal::UnknownRegion => 4,
            Refusal::OutOfBounds { .. } => 5,
            Refusal::Misaligned => 6,
            Refusal::TooLarge => 7,
            Refusal::Busy => 8,
            Refusal::Other(n) => n,
        }
    }

    /// A short name (for counters and logs).
    pub fn name(self) -> &'static str {
        match self {
            Refusal::Ungranted { .. } => "ungranted",
            Refusal::Revoked => "revoked",
            Refusal::BadKey => "bad_key",
            Refusal::UnknownRegion => "unknown_region",
            Refusal::OutOfBounds { .. } => "out_of_bounds",
            Refusal::Misaligned => "misaligned",
            Refusal::TooLarge => "too_large",
            Refusal::Busy => "busy",
            Refusal::Other(_) => "other",
        }
    }

    /// The detail on the wire: the access needed, or the region's length.
    pub fn detail(self) -> u64 {
        match self {
            Refusal::Ungranted { needed } => needed as u64,
            Refusal::OutOfBounds { region_len } => region_len,
            _ => 0,
        }
    }

    /// From the code and detail on the wire.
    pub fn from_wire(code: u8, detail: u64) -> Self {
        match code {
            1 => Refusal::Ungranted { needed: detail as u8 },
            2 => Refusal::Revoked,
            3 => Refusal::BadKey,
            4 => Refusal::UnknownRegion,
            5 => Refusal::OutOfBounds { region_len: detail },
            6 => Refusal::Misaligned,
            7 => Refusal::TooLarge,
            8 => Refusal::Busy,
            n => Refusal::Other(n),
        }
    }
}
