//! The edge transport's hooks for a relay that sits on it (the virtual NIC), behind one handle:
//! where arriving messages go at once, and what the network thread watches besides its sockets.

use std::sync::Arc;

use crate::node::Node;
use crate::sync::write;
use crate::watch::{EachMessage, EdgeMessageHandler, EdgeWatch};
use crate::{Error, NodeId};

/// The edge transport's hooks of one fabric ([`crate::Fabric::edge`]). They do nothing for
/// peers over shared memory: messages from those still wait in their rings for the receive
/// calls.
pub struct EdgeHooks<'a> {
    pub(crate) node: &'a Node,
}

impl EdgeHooks<'_> {
    /// Hand every message that arrives over the edge transport to `handler` at once, in the
    /// thread that receives it (the transport's network thread, or an application thread
    /// driving it), in order per peer, instead of queueing it for
    /// [`crate::Fabric::recv_timeout`] and its kin. A relay that passes messages on (the
    /// virtual NIC) saves the hand-over to a receiving thread and its wake-up. Set once; the
    /// handler must not block for long (it holds up the frames behind it) and must not call
    /// back into the fabric's receive calls.
    pub fn set_message_handler(&self, handler: impl Fn(NodeId, &[u8]) + Send + Sync + 'static) -> Result<(), Error> {
        self.set_handler(EachMessage(handler))
    }

    /// [`EdgeHooks::set_message_handler`] with a handler given the messages received together
    /// at once (see [`EdgeMessageHandler`]), to pass several on together. Set once (either
    /// way).
    pub fn set_handler(&self, handler: impl EdgeMessageHandler) -> Result<(), Error> {
        self.node
            .edge_messages
            .set(Arc::new(handler))
            .map_err(|_| Error::Config("this fabric's edge message handler is set already".into()))
    }

    /// Have the edge transport's network thread watch `watch`'s descriptor while it looks for
    /// more work after its last (see [`EdgeWatch`]). Replaces the watch set before (nothing is
    /// taken from that one once this returns); [`EdgeHooks::clear_watch`] removes it.
    pub fn set_watch(&self, watch: Arc<dyn EdgeWatch>) {
        *write(&self.node.edge_watch) = Some(watch);
    }

    /// Remove the watch [`EdgeHooks::set_watch`] set, if any. Once this returns, nothing is
    /// taken from it any more (a take under way is waited for); the network thread tells it
    /// it stopped watching when it next finds its descriptor readable, or when it sleeps.
    pub fn clear_watch(&self) {
        write(&self.node.edge_watch).take();
    }
}
