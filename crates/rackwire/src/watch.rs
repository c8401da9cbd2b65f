//! What the edge transport's network thread hands arriving messages to, and watches besides
//! its sockets (a leaf: it imports nothing of this crate; set through [`crate::EdgeHooks`]).

use std::os::fd::BorrowedFd;

use rackwire_mh::NodeId;

/// Where messages arriving over the edge transport go at once (see
/// [`crate::EdgeHooks::set_handler`]): the messages one round of the transport took (a batch
/// of received frames), in order per peer, together, so a handler that can pass several on at
/// once (the virtual NIC: datagrams of one flow into one write) sees which arrived together. A
/// handler of each message alone is a closure (see [`crate::EdgeHooks::set_message_handler`]).
pub trait EdgeMessageHandler: Send + Sync + 'static {
    /// Messages received together, each with its sender; never empty.
    fn messages(&self, batch: &[(NodeId, Vec<u8>)]);
}

impl<T: EdgeMessageHandler + ?Sized> EdgeMessageHandler for std::sync::Arc<T> {
    fn messages(&self, batch: &[(NodeId, Vec<u8>)]) {
        (**self).messages(batch)
    }
}

/// A closure of one message as an [`EdgeMessageHandler`].
pub(crate) struct EachMessage<F>(pub(crate) F);

impl<F: Fn(NodeId, &[u8]) + Send + Sync + 'static> EdgeMessageHandler for EachMessage<F> {
    fn messages(&self, batch: &[(NodeId, Vec<u8>)]) {
        for (from, data) in batch {
            (self.0)(*from, data)
        }
    }
}

/// A descriptor on which an edge message handler's messages get answered, watched by the
/// edge transport's network thread (see [`crate::EdgeHooks::set_watch`]). That thread, after it
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
