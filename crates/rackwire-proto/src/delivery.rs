//! What a connection delivered and the application has not taken yet: its messages and
//! notifications, within bounds the connection is told of (see
//! [`Connection::set_delivery_room`]). A data frame that would hand over more than the room
//! left is dropped unacknowledged and sent again later, so a receiver that does not read
//! holds its sender back instead of growing without bound.

use std::collections::VecDeque;

use crate::{Connection, Event};

/// A notification as delivered: an operation with one placed its data here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Note {
    /// Region.
    pub region: u32,
    /// Offset.
    pub offset: u64,
    /// Length.
    pub len: u64,
    /// Immediate.
    pub imm: u64,
}

/// One connection's delivered messages and notifications (see the module documentation).
#[derive(Debug)]
pub struct Delivery {
    msgs: VecDeque<Vec<u8>>,
    /// Bytes of `msgs`.
    msg_bytes: usize,
    notes: VecDeque<Note>,
    msg_bytes_max: usize,
    notes_max: usize,
}

impl Delivery {
    /// Queues that hold at most `msg_bytes_max` bytes of messages and `notes_max`
    /// notifications; `conn` is told so.
    pub fn new(conn: &mut Connection, msg_bytes_max: usize, notes_max: usize) -> Self {
        let d = Delivery { msgs: VecDeque::new(), msg_bytes: 0, notes: VecDeque::new(), msg_bytes_max, notes_max };
        d.tell(conn);
        d
    }

    /// Tell `conn` how much more the queues take.
    fn tell(&self, conn: &mut Connection) {
        conn.set_delivery_room(
            self.msg_bytes_max.saturating_sub(self.msg_bytes),
            self.notes_max.saturating_sub(self.notes.len()),
        );
    }

    /// Keep a message or notification event (the connection counted it against the room it
    /// was told of); any other event is handed back.
    pub fn keep(&mut self, e: Event) -> Option<Event> {
        match e {
            Event::Message { data } => {
                self.msg_bytes += data.len();
                self.msgs.push_back(data);
                None
            }
            Event::Notification { region, offset, len, imm } => {
                self.notes.push_back(Note { region, offset, len, imm });
                None
            }
            other => Some(other),
        }
    }

    /// The oldest message not yet taken; `conn` learns of the room it freed.
    pub fn next_message(&mut self, conn: &mut Connection) -> Option<Vec<u8>> {
        let m = self.msgs.pop_front()?;
        self.msg_bytes -= m.len();
        self.tell(conn);
        Some(m)
    }

    /// The oldest notification not yet taken; `conn` learns of the room it freed.
    pub fn next_note(&mut self, conn: &mut Connection) -> Option<Note> {
        let n = self.notes.pop_front()?;
        self.tell(conn);
        Some(n)
    }

    /// Tell `conn` the room left (after events were kept: it lowered its own count as it
    /// handed them over, and this sets it from the queues again).
    pub fn refresh(&self, conn: &mut Connection) {
        self.tell(conn);
    }

    /// Nothing waits to be taken.
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty() && self.notes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    // Checks the queues' accounting: kept messages and notifications come out in order, other
    // events are handed back, and the bytes and notifications counted as waiting (from which
    // the room the connection is told of is computed) rise and fall with what is kept and
    // taken.
    #[test]
    fn keeps_in_order_and_hands_back_the_rest() {
        let mut conn =
            Connection::accept(Config::new(1, 1472), 2, &crate::conn::test_credentials(), 1, [0; 32], [0; 32], 1, 0);
        let mut d = Delivery::new(&mut conn, 100, 2);
        assert!(d.keep(Event::Message { data: b"one".to_vec() }).is_none());
        assert!(d.keep(Event::Notification { region: 1, offset: 2, len: 3, imm: 4 }).is_none());
        assert!(d.keep(Event::Message { data: b"two".to_vec() }).is_none());
        assert_eq!(d.keep(Event::LinkUp(0)), Some(Event::LinkUp(0)));
        assert_eq!((d.msg_bytes, d.notes.len()), (6, 1));
        assert_eq!(d.next_message(&mut conn).as_deref(), Some(&b"one"[..]));
        assert_eq!(d.next_note(&mut conn), Some(Note { region: 1, offset: 2, len: 3, imm: 4 }));
        assert_eq!(d.next_message(&mut conn).as_deref(), Some(&b"two"[..]));
        assert_eq!(d.msg_bytes, 0);
        assert!(d.is_empty() && d.next_message(&mut conn).is_none() && d.next_note(&mut conn).is_none());
    }
}
