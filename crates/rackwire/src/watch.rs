//! What the edge transport's network thread hands arriving messages to, and watches besides
//! its sockets (a leaf: it imports nothing of this crate).

use std::os::fd::BorrowedFd;

use rackwire_mh::NodeId;

/// Where messages arriving over the edge transport go at once (see
/// [`crate::Fabric::set_edge_handler`]): each message, in order per peer, then the end of the
/// messages handed over together (those one round of the transport took: a batch of received
/// frames). A handler of each message alone is a closure (see
/// [`crate::Fabric::set_edge_message_handler`]).
pub trait EdgeMessageHandler: Send + Sync + 'static {
    /// A message from `from`.
    fn message(&self, from: NodeId, data: &[u8]);
    /// The messages handed over together end here: a handler that gathers them (the virtual
    /// NIC: packets of one flow into one write) passes on what it holds now.
    fn batch_end(&self) {}
}

impl<T: EdgeMessageHandler + ?Sized> EdgeMessageHandler for std::sync::Arc<T> {
    fn message(&self, from: NodeId, data: &[u8]) {
        (**self).message(from, data)
    }

    fn batch_end(&self) {
        (**self).batch_end()
    }
}

/// A closure as an [`EdgeMessageHandler`], with nothing to do at a batch's end.
pub(crate) struct EachMessage<F>(pub(crate) F);

impl<F: Fn(NodeId, &[u8]) + Send + Sync + 'static> EdgeMessageHandler for EachMessage<F> {
    fn message(&self, from: NodeId, data: &[u8]) {
        (self.0)(from, data)
    }
}

/// A descriptor on which an edge message handler's messages get answered, watched by the
/// edge transport's network thread (see [`crate::Fabric::set_edge_watch`]). That thread, after it
/// hands messages over, looks for more work for a moment before it sleeps (a spin); while it
/// does, it also watches this descriptor and, when it is readable, calls [`EdgeWatch::take`].
/// The virtual NIC writes packets from other racks into `rw0`, where the program they were for
/// (or the kernel) answers within microseconds: the thread that wrote them, still awake,
/// carries the answer off without another thread's wake-up.
pub trait EdgeWatch: Send + Sync + 'static {
    /// The descriptor to watch for input.
    fn fd(&self) -> BorrowedFd<'_>;
    /// The network thread starts (`true`) or stops (`false`) watching: a thread of the
    /// handler's own that sleeps on the descriptor may leave it to the network thread
    /// meanwhile (and must be awake on it again once told `false`).
    fn watching(&self, on: bool);
    /// The descriptor is readable: take what is there without blocking. Runs on the network
    /// thread without the transport's locks held: it may send, not wait for an operation to
    /// complete, nor set or clear the fabric's watch (which is read-locked meanwhile). True
    /// when there was something.
    fn take(&self) -> bool;
}
