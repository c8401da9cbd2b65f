//! One node's connections, routed by the connection id in each frame's header.
//!
//! Like quinn-proto's `Endpoint`, it holds no sockets, threads or clock: a driver hands it
//! each arriving frame with the link and the address it came from, and it finds the frame's
//! connection (by the id this end chose, which the peer puts in every frame), or, for a first
//! handshake frame addressed to this node, opens one — once: a repeated first frame (the
//! peer sends it again until answered) finds the connection it opened. Frames for no
//! connection of this node, handshakes meant for another node, and first frames on a link the
//! peer does not have are dropped. What a connection keeps beside the protocol (the driver's
//! queues and handles) is the driver's own type `S`, reached through [`Slot`].

use std::collections::HashMap;

use rackwire_wire::{Frame, FrameKind, HandshakeRepr, HEADER_LEN};

use crate::{Connection, OwnIdMap, Target, Time};

/// The most connections one endpoint keeps (each is a peer on the edge transport).
pub const CONNECTIONS_MAX: usize = 4096;

/// What an endpoint keeps per connection: the connection, and the peer's address on each link
/// (learned from the frames that arrive), beside whatever the driver needs.
pub trait Slot {
    /// A link address.
    type Addr: Copy;
    /// The connection.
    fn conn(&mut self) -> &mut Connection;
    /// The peer was heard on `link` from `addr`: later frames on that link go there.
    fn heard_from(&mut self, link: usize, addr: Self::Addr);
}

/// A first handshake frame that opens a connection: who from, their id for it, and how many
/// links it may use (the fewer of the two ends').
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The peer's node id.
    pub peer: u32,
    /// The peer's id for the connection.
    pub peer_conn: u32,
    /// Links both ends have.
    pub links: usize,
}

/// Where a frame went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routed {
    /// To the connection with this (local) id.
    Conn(u32),
    /// To a connection it opened, with this id.
    Accepted(u32),
    /// Nowhere: not for this node, or for no connection of it.
    Dropped,
}

/// One node's connections (see the module documentation).
#[derive(Debug)]
pub struct Endpoint<S> {
    me: u32,
    links: usize,
    slots: OwnIdMap<u32, S>,
    /// Connections opened by a first handshake frame, by (peer, the peer's id for it).
    accepted: HashMap<(u32, u32), u32>,
    next_local: u32,
}

impl<S: Slot> Endpoint<S> {
    /// An endpoint of node `me` with `links` links.
    pub fn new(me: u32, links: usize) -> Self {
        Endpoint { me, links, slots: OwnIdMap::default(), accepted: HashMap::new(), next_local: 1 }
    }

    /// Add a connection this node opens: `make` builds its slot from the local id it gets
    /// (the id goes into [`Connection::connect`]). None when [`CONNECTIONS_MAX`] are open.
    pub fn open(&mut self, make: impl FnOnce(u32) -> S) -> Option<u32> {
        if self.slots.len() >= CONNECTIONS_MAX {
            return None;
        }
        let local = self.next_id();
        self.slots.insert(local, make(local));
        Some(local)
    }

    fn next_id(&mut self) -> u32 {
        loop {
            let id = self.next_local;
            self.next_local = self.next_local.checked_add(1).unwrap_or(1);
            // 0 is "no connection yet" on the wire; an id in use is skipped after a wrap.
            if id != 0 && !self.slots.contains_key(&id) {
                return id;
            }
        }
    }

    /// A frame arrived on `link` from `from`: route it (opening a connection with `accept`
    /// for a new peer's first handshake frame: it gets the local id and what the frame said,
    /// and gives `None` to leave the frame unanswered, for a peer whose node key it does not
    /// know yet) and feed it to its connection.
    #[allow(clippy::too_many_arguments)]
    pub fn handle(
        &mut self,
        now: Time,
        link: usize,
        from: S::Addr,
        frame: &[u8],
        target: &mut dyn Target,
        accept: impl FnOnce(u32, Incoming) -> Option<S>,
    ) -> Routed {
        let Some((local, opened)) = self.route(link, frame, accept) else { return Routed::Dropped };
        let Some(s) = self.slots.get_mut(&local) else { return Routed::Dropped };
        s.heard_from(link, from);
        s.conn().handle_frame(now, link, frame, target);
        if opened {
            Routed::Accepted(local)
        } else {
            Routed::Conn(local)
        }
    }

    /// The local id of a frame's connection, and whether it was just opened.
    fn route(
        &mut self,
        link: usize,
        frame: &[u8],
        accept: impl FnOnce(u32, Incoming) -> Option<S>,
    ) -> Option<(u32, bool)> {
        // Only the connection id and the kind are read here, unchecked: the connection checks
        // the whole frame (checksums included) once, and drops it if damaged.
        if frame.len() < HEADER_LEN {
            return None;
        }
        let f = Frame::new_unchecked(frame);
        if f.conn() != 0 || f.kind() != FrameKind::Handshake {
            return Some((f.conn(), false));
        }
        // A first handshake frame: whose, and how many links.
        let h = HandshakeRepr::parse(&frame[HEADER_LEN..]).ok()?;
        if h.to != self.me {
            return None;
        }
        if let Some(&local) = self.accepted.get(&(h.from, h.conn)) {
            return Some((local, false));
        }
        let links = (h.links as usize).min(self.links);
        if link >= links || self.slots.len() >= CONNECTIONS_MAX {
            return None;
        }
        let local = self.next_id();
        let slot = accept(local, Incoming { peer: h.from, peer_conn: h.conn, links })?;
        self.slots.insert(local, slot);
        self.accepted.insert((h.from, h.conn), local);
        Some((local, true))
    }

    /// The connection `local`'s slot.
    pub fn get(&self, local: u32) -> Option<&S> {
        self.slots.get(&local)
    }

    /// The connection `local`'s slot, to change.
    pub fn get_mut(&mut self, local: u32) -> Option<&mut S> {
        self.slots.get_mut(&local)
    }

    /// Forget connection `local` (a first frame from its peer would open a new one).
    pub fn remove(&mut self, local: u32) -> Option<S> {
        self.accepted.retain(|_, l| *l != local);
        self.slots.remove(&local)
    }

    /// Forget that connection `local` was opened by a peer's first frame: a repeated first
    /// frame now opens a new one (for a connection that closed).
    pub fn forget_accepted(&mut self, local: u32) {
        self.accepted.retain(|_, l| *l != local);
    }

    /// Every slot.
    pub fn slots(&self) -> impl Iterator<Item = &S> {
        self.slots.values()
    }

    /// Every slot, to change.
    pub fn slots_mut(&mut self) -> impl Iterator<Item = &mut S> {
        self.slots.values_mut()
    }

    /// Every slot with its local id, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut S)> {
        self.slots.iter_mut().map(|(&l, s)| (l, s))
    }

    /// Connections open.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// No connection is open.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}
