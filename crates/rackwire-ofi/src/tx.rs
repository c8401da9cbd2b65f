//! Sends on their way: where a send's bytes are, and a send (or an RMA request or answer) cut
//! into the pieces that go into the peer's ring.

use crate::consts::*;
use crate::queues::{Addr, TxDone};
use crate::user::{capacity, copy_out, gather, Iov, Iovs, Registered};
use crate::wire::{Header, Kind, FRAGMENT_BYTES_MAX};

/// Where a send's bytes are.
#[derive(Debug)]
pub(crate) enum Source {
    /// Copied at the call (injects, whose buffer the application may reuse at once).
    Owned(Vec<u8>),
    /// The application's buffer, valid until the send completes (libfabric's contract):
    /// copied piece by piece into the peer's ring as it has room.
    User(Iovs),
    /// A read's answer: `len` bytes at `at` of registered region `key`, copied piece by piece
    /// into the peer's ring (no copy of the whole, however large the read); a region closed
    /// before they all went leaves the rest as a [`Source::Tail`] ([`State::mr_close`]).
    ///
    /// [`State::mr_close`]: crate::engine::State
    Region { mem: Registered, key: u64, at: u64 },
    /// The bytes from `from` on of a read's answer, copied when its region closed.
    Tail { bytes: Vec<u8>, from: usize },
}

impl Source {
    /// The bytes of `iov` for an operation flagged `flags`: copied now for an inject, left in
    /// the application's buffer otherwise.
    pub(crate) fn of(iov: &[Iov], flags: u64) -> Source {
        if flags & FI_INJECT != 0 {
            let mut all = Vec::with_capacity(capacity(iov));
            gather(iov, &mut all);
            Source::Owned(all)
        } else {
            Source::User(iov.into())
        }
    }
}

/// A send (or an RMA request or answer) not yet wholly handed to its peer.
#[derive(Debug)]
pub(crate) struct TxOp {
    pub dest: Addr,
    pub header: Header,
    pub src: Source,
    pub total: usize,
    /// Bytes handed over so far.
    pub sent: usize,
    /// How it completes once handed over (RMA operations complete on the target's answer).
    pub done: Option<TxDone>,
}

impl TxOp {
    /// An answer to an RMA request of another node's (which counts against that node's
    /// [`crate::engine::ANSWERS_QUEUED_MAX`]).
    pub(crate) fn is_answer(&self) -> bool {
        self.done.is_none() && matches!(self.header.kind, Kind::Ack | Kind::ReadResp)
    }

    /// The header and length of the next piece.
    pub(crate) fn next_piece(&self) -> (Header, usize) {
        match self.header.kind {
            Kind::Write | Kind::ReadResp => {
                let n = (self.total - self.sent).min(FRAGMENT_BYTES_MAX);
                let at = self.header.len_or_offset + self.sent as u64;
                let last = self.sent + n == self.total;
                return (Header { len_or_offset: at, last, ..self.header }, n);
            }
            Kind::ReadReq | Kind::Atomic | Kind::Ack => return (self.header, self.total),
            Kind::Whole | Kind::First | Kind::Next => {}
        }
        if self.total <= FRAGMENT_BYTES_MAX {
            return (Header { kind: Kind::Whole, len_or_offset: 0, ..self.header }, self.total);
        }
        let n = (self.total - self.sent).min(FRAGMENT_BYTES_MAX);
        let h = if self.sent == 0 {
            Header { kind: Kind::First, len_or_offset: self.total as u64, ..self.header }
        } else {
            Header { kind: Kind::Next, len_or_offset: self.sent as u64, ..self.header }
        };
        (h, n)
    }

    /// Write the next piece (header `h`, `n` bytes) into `buf`.
    pub(crate) fn fill(&self, h: &Header, n: usize, buf: &mut [u8]) {
        let at = h.encode(buf);
        let out = &mut buf[at..at + n];
        match &self.src {
            Source::Owned(v) => out.copy_from_slice(&v[self.sent..self.sent + n]),
            Source::User(iov) => {
                copy_out(iov, self.sent, out);
            }
            Source::Region { mem, at, .. } => mem.copy_out(at + self.sent as u64, out),
            Source::Tail { bytes, from } => out.copy_from_slice(&bytes[self.sent - from..self.sent - from + n]),
        }
    }
}
