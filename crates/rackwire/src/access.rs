//! Access rights on a region.

use std::fmt;
use std::ops::BitOr;

/// What a peer may do to a region: any mix of remote read, remote write and remote atomics.
///
/// How exactly a grant holds depends on the transport between the two nodes. Over the edge
/// transport the owner checks every operation against the rights named, one by one. Over
/// shared memory the peer maps the region: a grant of [`Access::READ`] alone gives a
/// read-only mapping that the kernel keeps read-only (the memory is sealed against new
/// writable mappings, whatever the peer does to its descriptor); a grant with any store right
/// ([`Access::WRITE`] or [`Access::ATOMIC`]) gives a mapping the peer can read and write with
/// plain loads, stores and atomic instructions — the kernel cannot map memory write-only, nor
/// tell a store from an atomic. Grant store rights over shared memory only to peers that may
/// also read the region and change it any way; for data such a peer must not read, use a
/// region the owner serves ([`crate::Fabric::alloc_served`]), where every grant holds exactly
/// as named on every transport.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Access(u8);

impl Access {
    /// No access.
    pub const NONE: Access = Access(0);
    /// Remote reads.
    pub const READ: Access = Access(1);
    /// Remote writes (including scatter-gather batches).
    pub const WRITE: Access = Access(2);
    /// Remote compare-and-swap and fetch-and-add.
    pub const ATOMIC: Access = Access(4);
    /// Everything.
    pub const ALL: Access = Access(7);

    /// True when every right in `other` is in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// The raw bits (1 read, 2 write, 4 atomic).
    pub fn bits(self) -> u8 {
        self.0
    }

    /// From raw bits; unknown bits are dropped.
    pub fn from_bits(bits: u8) -> Access {
        Access(bits & Access::ALL.0)
    }

    /// Whether a peer with these rights may store into the memory.
    pub(crate) fn stores(self) -> bool {
        self.0 & (Access::WRITE.0 | Access::ATOMIC.0) != 0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = |a: Access, ch: char| if self.contains(a) { ch } else { '-' };
        write!(f, "{}{}{}", c(Access::READ, 'r'), c(Access::WRITE, 'w'), c(Access::ATOMIC, 'a'))
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Access({self})")
    }
}

/// Access rights written with letters other than `r`, `w`, `a` and `-`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("access {0:?}: use the letters r, w, a")]
pub struct ParseAccessError(pub String);

impl std::str::FromStr for Access {
    type Err = ParseAccessError;
    /// Parses letters `r`, `w`, `a` (any order; `-` ignored), e.g. `rw`, `r-a`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut a = Access::NONE;
        for ch in s.chars() {
            a = a | match ch {
                'r' => Access::READ,
                'w' => Access::WRITE,
                'a' => Access::ATOMIC,
                '-' => Access::NONE,
                _ => return Err(ParseAccessError(s.to_string())),
            };
        }
        Ok(a)
    }
}
