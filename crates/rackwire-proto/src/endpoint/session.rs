//! One connection as an endpoint keeps it: the connection, where its peer was heard on each
//! link, the operations submitted on it and not yet complete (each with what the driver needs
//! to finish its handle), and what it delivered that the application has not taken.

use crate::{Connection, Delivery, Note, OpError, OpId, OwnIdMap};

/// One connection of an [`Endpoint`](super::Endpoint) (see the module documentation). `A` is a
/// link address, `P` what the driver keeps per operation in flight.
#[derive(Debug)]
pub struct Session<A, P> {
    conn: Connection,
    peer: u32,
    addrs: Vec<Option<A>>,
    pending: OwnIdMap<OpId, P>,
    /// Delivered messages and notifications not yet taken, within bounds; `None`: no bounds,
    /// every one is handed to the driver as it comes.
    delivery: Option<Delivery>,
    connected: bool,
    closed: bool,
    /// Opened by the peer's first handshake frame (not by this node).
    accepted: bool,
    /// Answers are held for the reply the application is likely to send.
    holding: bool,
}

impl<A: Copy, P> Session<A, P> {
    pub(super) fn new(
        mut conn: Connection,
        peer: u32,
        addrs: Vec<Option<A>>,
        room: Option<(usize, usize)>,
        accepted: bool,
    ) -> Self {
        let delivery = room.map(|(bytes, notes)| Delivery::new(&mut conn, bytes, notes));
        Session {
            conn,
            peer,
            addrs,
            pending: OwnIdMap::default(),
            delivery,
            connected: false,
            closed: false,
            accepted,
            holding: false,
        }
    }

    /// The connection.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// The connection, to change.
    pub fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The peer's node id.
    pub fn peer(&self) -> u32 {
        self.peer
    }

    /// Where the peer was last heard on `link` (or was told to be, for a connection opened
    /// here).
    pub fn addr(&self, link: usize) -> Option<A> {
        self.addrs.get(link).copied().flatten()
    }

    /// The peer's address on every link it was heard on.
    pub fn addrs(&self) -> impl Iterator<Item = A> + '_ {
        self.addrs.iter().flatten().copied()
    }

    /// A frame came on `link` from `addr`: the peer is there if the frame `proven` it sent it,
    /// or, while `handshaking`, if it was never heard on that link.
    pub(super) fn heard_from(&mut self, link: usize, addr: A, proven: bool, handshaking: bool) {
        if let Some(a) = self.addrs.get_mut(link) {
            if proven || (handshaking && a.is_none()) {
                *a = Some(addr);
            }
        }
    }

    /// The handshake completed (and the connection has not closed since).
    pub fn is_connected(&self) -> bool {
        self.connected && !self.closed
    }

    /// The connection ended.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Connected, but no link answers: the peer cannot be reached for now (which is not the
    /// same as gone: see [`Connection::reachable`]).
    pub fn is_unreachable(&self) -> bool {
        self.is_connected() && !self.conn.reachable()
    }

    /// Operations submitted and not yet complete.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Submit an operation with `go`, keeping what `keep` makes of its id until it completes.
    pub(super) fn submit(
        &mut self,
        keep: impl FnOnce(OpId) -> P,
        go: impl FnOnce(&mut Connection) -> Result<OpId, OpError>,
    ) -> Result<OpId, OpError> {
        if self.closed {
            return Err(OpError::Closed);
        }
        let id = go(&mut self.conn)?;
        self.pending.insert(id, keep(id));
        Ok(id)
    }

    pub(super) fn complete(&mut self, op: OpId) -> Option<P> {
        self.pending.remove(&op)
    }

    /// The connection ended: its handshake state and every operation still pending.
    pub(super) fn close(&mut self) -> impl Iterator<Item = P> + '_ {
        self.closed = true;
        self.pending.drain().map(|(_, p)| p)
    }

    pub(super) fn set_connected(&mut self, peer: u32) {
        self.connected = true;
        self.peer = peer;
    }

    /// Opened by the peer's first handshake frame (not by this node).
    pub fn accepted(&self) -> bool {
        self.accepted
    }

    /// The handshake completed at some point (the connection may have ended since).
    pub fn handshake_completed(&self) -> bool {
        self.connected
    }

    pub(super) fn delivery_mut(&mut self) -> Option<&mut Delivery> {
        self.delivery.as_mut()
    }

    /// Tell the connection the room its queues have left (after it handed events over: it
    /// lowered its own count as it did).
    pub(super) fn refresh_room(&mut self) {
        if let Some(d) = &self.delivery {
            d.refresh(&mut self.conn);
        }
    }

    /// Bound what this connection delivers and the application has not taken.
    pub(super) fn set_room(&mut self, bytes: usize, notes: usize) {
        self.delivery = Some(Delivery::new(&mut self.conn, bytes, notes));
    }

    /// Hold answers until `until` (0: stop holding).
    pub(super) fn hold(&mut self, until: crate::Time) {
        self.holding = until != 0;
        self.conn.hold_answers(until);
    }

    pub(super) fn is_holding(&self) -> bool {
        self.holding
    }

    /// The oldest message delivered and not yet taken (with delivery bounds).
    pub fn next_message(&mut self) -> Option<Vec<u8>> {
        self.delivery.as_mut()?.next_message(&mut self.conn)
    }

    /// The oldest notification delivered and not yet taken (with delivery bounds).
    pub fn next_note(&mut self) -> Option<Note> {
        self.delivery.as_mut()?.next_note(&mut self.conn)
    }

    /// Nothing delivered waits to be taken.
    pub fn nothing_to_take(&self) -> bool {
        self.delivery.as_ref().is_none_or(Delivery::is_empty)
    }
}
