//! Completion queues, counters and address vectors: what the application reads completions
//! from, counts operations with, and names peers through.

use std::collections::VecDeque;

use rackwire::NodeId;
use rackwire_proto::OwnIdMap;

use crate::consts::*;

/// Where a message came from, or goes: a node and an endpoint of it.
pub type Addr = (NodeId, u32);

/// Bytes of an address as `fi_getname` gives it: the node id, then the endpoint, each a
/// little-endian u32.
pub const ADDR_BYTES: usize = 8;

/// Entries a completion queue holds at most (its `size` attribute is capped to this).
pub const CQ_ENTRIES_MAX: usize = 1 << 16;
/// Addresses an address vector holds at most.
pub const AV_ENTRIES_MAX: usize = 1 << 20;

/// An address in its wire form.
pub fn addr_bytes(a: Addr) -> [u8; ADDR_BYTES] {
    let mut b = [0u8; ADDR_BYTES];
    b[..4].copy_from_slice(&a.0.to_le_bytes());
    b[4..].copy_from_slice(&a.1.to_le_bytes());
    b
}

/// An address from its wire form.
pub fn addr_from(b: &[u8]) -> Option<Addr> {
    let b: &[u8; ADDR_BYTES] = b.try_into().ok()?;
    Some((u32::from_le_bytes(b[..4].try_into().ok()?), u32::from_le_bytes(b[4..].try_into().ok()?)))
}

/// One completion (`struct fi_cq_tagged_entry` and the source address for `fi_cq_readfrom`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// The operation's context.
    pub ctx: usize,
    /// `FI_SEND`/`FI_RECV`, `FI_MSG`/`FI_TAGGED`, `FI_REMOTE_CQ_DATA`.
    pub flags: u64,
    /// Bytes received (or sent).
    pub len: usize,
    /// Where a receive's data starts.
    pub buf: usize,
    /// Remote CQ data.
    pub data: u64,
    /// The tag.
    pub tag: u64,
    /// The sender as an address of the receiving endpoint's vector (`FI_ADDR_NOTAVAIL` when
    /// it is not in it).
    pub src: u64,
}

/// A completion in error (`struct fi_cq_err_entry`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrEntry {
    /// What completed.
    pub entry: Entry,
    /// Bytes that did not fit (`FI_ETRUNC`).
    pub olen: usize,
    /// The error (positive).
    pub err: i32,
    /// The provider's own code: a [`ProvErr`].
    pub prov_errno: i32,
}

/// Why an operation failed, as the provider tells it (`fi_cq_strerror`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ProvErr {
    /// The message was larger than the receive buffer.
    Truncated = 1,
    /// The application cancelled it.
    Cancelled = 2,
    /// The peer is gone or unreachable.
    PeerGone = 3,
    /// No message matched a peek.
    NoMessage = 4,
    /// The fabric refused the operation.
    Fabric = 5,
    /// The target refused the access: the key, the range, the region's rights, or the
    /// initiator is not among the target endpoint's peers.
    Refused = 6,
}

impl ProvErr {
    /// The text of code `code`, NUL-terminated (for `fi_cq_strerror`).
    pub fn text(code: i32) -> &'static str {
        match code {
            1 => "rackwire: the message was larger than the receive buffer; the rest was dropped\0",
            2 => "rackwire: cancelled\0",
            3 => "rackwire: the peer node is gone or cannot be reached\0",
            4 => "rackwire: no message matched\0",
            5 => "rackwire: the fabric refused the operation\0",
            6 => "rackwire: the target refused the access (key, range, rights, or not one of its peers)\0",
            _ => "rackwire: unknown error\0",
        }
    }
}

/// How a send (or an RMA operation) completes: into its endpoint's transmit queue.
#[derive(Debug)]
pub(crate) struct TxDone {
    pub ep: u32,
    pub ctx: usize,
    pub flags: u64,
    pub len: usize,
    /// Whether a completion is written (not for injects and unflagged selective sends).
    pub completion: bool,
}

/// A completion queue.
#[derive(Debug)]
pub struct Cq {
    /// Its entry format.
    pub format: i32,
    /// Completions not yet read.
    pub entries: VecDeque<Entry>,
    /// Completions in error not yet read (read first).
    pub errors: VecDeque<ErrEntry>,
    /// A waiter was told to stop waiting (`fi_cq_signal`).
    pub signaled: bool,
}

impl Cq {
    /// A queue of entries in `format`.
    pub fn new(format: i32) -> Cq {
        Cq { format, entries: VecDeque::new(), errors: VecDeque::new(), signaled: false }
    }
}

/// A counter.
#[derive(Debug, Default)]
pub struct Cntr {
    /// Operations completed.
    pub value: u64,
    /// Operations failed.
    pub errors: u64,
}

/// An address vector.
#[derive(Debug)]
pub struct Av {
    /// `FI_AV_TABLE` or `FI_AV_MAP`.
    pub kind: i32,
    /// Table: the address at each index (a removed one is `None`).
    table: Vec<Option<Addr>>,
    /// Addresses inserted, and their `fi_addr_t`.
    index: OwnIdMap<Addr, u64>,
    /// Entries naming each node.
    nodes: OwnIdMap<NodeId, u32>,
}

impl Av {
    /// An empty vector of `kind` (`FI_AV_UNSPEC` is a table).
    pub fn new(kind: i32) -> Av {
        let kind = if kind == FI_AV_MAP { FI_AV_MAP } else { FI_AV_TABLE };
        Av { kind, table: Vec::new(), index: OwnIdMap::default(), nodes: OwnIdMap::default() }
    }

    /// Insert `a`; its `fi_addr_t` (a table's next index; a map's encoding of it).
    pub fn insert(&mut self, a: Addr) -> Result<u64, i32> {
        if let Some(&fa) = self.index.get(&a) {
            if self.kind == FI_AV_MAP {
                return Ok(fa);
            }
        }
        if self.index.len() >= AV_ENTRIES_MAX {
            return Err(FI_ENOMEM);
        }
        let fa = if self.kind == FI_AV_MAP {
            (u64::from(a.0) << 32) | u64::from(a.1)
        } else {
            self.table.push(Some(a));
            (self.table.len() - 1) as u64
        };
        self.index.insert(a, fa);
        *self.nodes.entry(a.0).or_default() += 1;
        Ok(fa)
    }

    /// Whether an entry names node `n`.
    pub fn has_node(&self, n: NodeId) -> bool {
        self.nodes.contains_key(&n)
    }

    /// The nodes its entries name.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes.keys().copied()
    }

    /// The address behind `fa`.
    pub fn resolve(&self, fa: u64) -> Option<Addr> {
        if self.kind == FI_AV_MAP {
            let a = ((fa >> 32) as u32, fa as u32);
            return self.index.contains_key(&a).then_some(a);
        }
        self.table.get(usize::try_from(fa).ok()?).copied().flatten()
    }

    /// The `fi_addr_t` of `a`, if inserted.
    pub fn lookup(&self, a: Addr) -> Option<u64> {
        self.index.get(&a).copied()
    }

    /// Remove `fa`.
    pub fn remove(&mut self, fa: u64) -> Result<(), i32> {
        let a = self.resolve(fa).ok_or(FI_EINVAL)?;
        self.index.remove(&a);
        if self.kind == FI_AV_TABLE {
            self.table[fa as usize] = None;
        }
        if let Some(n) = self.nodes.get_mut(&a.0) {
            *n -= 1;
            if *n == 0 {
                self.nodes.remove(&a.0);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks both kinds of address vector: a table numbers addresses 0, 1, 2 in order of
    // insertion (the same address twice gets two entries), a map encodes the address itself
    // (the same address twice gets the same value); each resolves back, looks up by address,
    // and a removed or never-inserted value resolves to nothing.
    #[test]
    fn tables_and_maps_name_and_resolve_addresses() {
        let mut t = Av::new(FI_AV_TABLE);
        assert_eq!(t.insert((5, 0)), Ok(0));
        assert_eq!(t.insert((6, 1)), Ok(1));
        assert_eq!(t.insert((5, 0)), Ok(2));
        assert_eq!(t.resolve(1), Some((6, 1)));
        assert_eq!(t.resolve(3), None);
        t.remove(1).unwrap();
        assert_eq!(t.resolve(1), None);
        assert_eq!(t.remove(1), Err(FI_EINVAL));

        let mut m = Av::new(FI_AV_MAP);
        let fa = m.insert((7, 3)).unwrap();
        assert_eq!(m.insert((7, 3)), Ok(fa));
        assert_eq!(m.resolve(fa), Some((7, 3)));
        assert_eq!(m.lookup((7, 3)), Some(fa));
        assert_eq!(m.resolve((8 << 32) | 3), None, "a map resolves only what was inserted");
        assert_eq!(addr_from(&addr_bytes((7, 3))), Some((7, 3)));
        assert_eq!(addr_from(&[0u8; 7]), None);
    }
}
