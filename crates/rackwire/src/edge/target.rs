//! This node's memory as the edge transport's target sees it: every frame is checked against
//! the owner's grant table (the same as the shared-memory transport's), and the operation's
//! whole range against the region, before a byte is placed ([`crate::owner`]).

use super::{proto, Arc, Node, Weak};
use crate::owner;

/// This node's memory as the edge transport's target sees it.
pub(super) struct FabricTarget<'a> {
    pub(super) fabric: &'a Weak<Node>,
}

impl FabricTarget<'_> {
    fn node(&self) -> Result<Arc<Node>, proto::Refusal> {
        self.fabric.upgrade().ok_or(proto::Refusal::UnknownRegion)
    }
}

impl proto::Target for FabricTarget<'_> {
    fn write(&mut self, req: proto::RegionReq, whole: proto::Span, at: u64, data: &[u8]) -> Result<(), proto::Refusal> {
        owner::write(&*self.node()?, req.peer, req.region, req.key, whole.offset, whole.len, at, data)
    }

    fn read(&mut self, req: proto::RegionReq, offset: u64, out: &mut [u8]) -> Result<(), proto::Refusal> {
        owner::read(&*self.node()?, req.peer, req.region, req.key, offset, out)
    }

    fn atomic(&mut self, req: proto::RegionReq, offset: u64, op: proto::AtomicOp) -> Result<u64, proto::Refusal> {
        owner::atomic(&*self.node()?, req.peer, req.region, req.key, offset, op)
    }
}
