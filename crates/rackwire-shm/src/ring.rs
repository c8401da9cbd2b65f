//! A byte ring in the receiver's memory, managed by the sender.
//!
//! The receiver creates the ring (a [`SharedMem`]) and hands its descriptor to exactly one
//! sender. The sender writes records; the receiver reads them and advances `head`. The sender
//! keeps its own copy of `head` and re-reads the shared one only when the ring looks full
//! (Marlin's cached tail with lazy update): a sender that is not running out of room never
//! touches the cache line the receiver writes.
//!
//! There is no shared tail index. Each record header carries a *stamp*, its position in the
//! ring's byte stream plus one, written last with release ordering. The receiver knows the
//! position of the next record, so it polls that header alone: a record is there when its stamp
//! matches. A small record is found and read with a single cache-line transfer, where a tail
//! index would cost a second one.
//!
//! Layout:
//!
//! ```text
//! 0    head  u64   written by the receiver
//! 128  magic u64, capacity u64   written once by the receiver
//! 256  data  capacity bytes (a power of two)
//! ```
//!
//! A record is a 16-byte header (stamp u64, payload length u32, kind u32) and the payload,
//! padded to a cache line (64 bytes): a record starts a line, so one of up to 48 payload bytes
//! crosses from the sender's core to the receiver's in one line transfer, where a record
//! straddling two lines costs two, one after the other. A record never wraps: when it does not
//! fit before the end, a padding record fills the rest and the record starts at offset 0. Every
//! header is checked by the receiver before use, since the sender may be faulty: a malformed
//! ring is reported, never trusted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::mem::{MapAccess, SharedMem, ShmError};

const HEAD_OFFSET: u64 = 0;
const MAGIC_OFFSET: u64 = 128;
const CAPACITY_OFFSET: u64 = 136;
const DATA_OFFSET: u64 = 256;
const RING_MAGIC: u64 = 0x7277_7269_6e67_0003; // "rwring" v3 (records line-aligned)
/// Bytes of a record header.
pub const RECORD_HEADER_BYTES: u64 = 16;
const RECORD_ALIGN: u64 = 64;
const KIND_PAD: u32 = u32::MAX;

/// The smallest ring capacity in bytes.
pub const RING_BYTES_MIN: u64 = 4096;
/// The largest ring capacity in bytes.
pub const RING_BYTES_MAX: u64 = 64 << 20;

/// The largest payload a ring of `capacity` bytes accepts: half the ring less a header, so
/// that a record always fits once the receiver has drained what is before it.
pub const fn payload_bytes_max(capacity: u64) -> u64 {
    capacity / 2 - RECORD_HEADER_BYTES
}

/// Bytes a record with `len` payload bytes takes in the ring.
pub const fn record_bytes(len: u64) -> u64 {
    (RECORD_HEADER_BYTES + len + RECORD_ALIGN - 1) & !(RECORD_ALIGN - 1)
}

/// The stamp of the record at stream position `pos` (never 0, so zeroed memory is no record).
const fn stamp(pos: u64) -> u64 {
    pos.wrapping_add(1)
}

/// Why a push did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PushError {
    /// No room now; the receiver has not drained enough. Try again later.
    #[error("ring full")]
    Full,
    /// The record can never fit this ring.
    #[error("record of {len} bytes exceeds the ring's limit of {max}")]
    TooLarge {
        /// Payload length asked for.
        len: u64,
        /// The ring's limit.
        max: u64,
    },
}

/// The ring's word at `off`. Offsets are fixed header words or record slots
/// ([`slot_offset`]): aligned and inside the mapping (checked at attach and create), whatever a
/// peer wrote into the ring.
fn atomic(mem: &SharedMem, off: u64) -> &AtomicU64 {
    mem.atomic_u64(off).expect("ring words are aligned and in bounds by construction")
}

/// Where the record slot of stream position `pos` starts in the mapping: inside the data
/// area and aligned to a record, for any `pos` (positions read from shared memory are a
/// peer's word, not trusted to be either).
#[inline]
const fn slot_offset(cap: u64, pos: u64) -> u64 {
    DATA_OFFSET + (pos & (cap - 1) & !(RECORD_ALIGN - 1))
}

fn capacity_of(mem: &SharedMem) -> Result<u64, ShmError> {
    if (mem.len() as u64) < DATA_OFFSET + RING_BYTES_MIN {
        return Err(ShmError::BadRing("window smaller than a ring"));
    }
    let mut word = [0u8; 8];
    mem.read_at(MAGIC_OFFSET, &mut word);
    if u64::from_le_bytes(word) != RING_MAGIC {
        return Err(ShmError::BadRing("bad magic"));
    }
    mem.read_at(CAPACITY_OFFSET, &mut word);
    let cap = u64::from_le_bytes(word);
    if !cap.is_power_of_two()
        || !(RING_BYTES_MIN..=RING_BYTES_MAX).contains(&cap)
        || DATA_OFFSET + cap > mem.len() as u64
    {
        return Err(ShmError::BadRing("bad capacity"));
    }
    Ok(cap)
}

/// The receiving side of a ring; it owns the memory.
#[derive(Debug)]
pub struct RingReceiver {
    mem: Arc<SharedMem>,
    cap: u64,
    head: u64,
}

impl RingReceiver {
    /// Create a ring of `capacity` bytes (a power of two in
    /// [`RING_BYTES_MIN`]..=[`RING_BYTES_MAX`]).
    pub fn create(name: &str, capacity: u64) -> Result<Self, ShmError> {
        if !capacity.is_power_of_two() || !(RING_BYTES_MIN..=RING_BYTES_MAX).contains(&capacity) {
            return Err(ShmError::BadLength(capacity));
        }
        let mem = SharedMem::create(name, DATA_OFFSET + capacity)?;
        // Every record's pass through the ring then costs no page fault, the first as others.
        mem.prefault();
        mem.write_at(MAGIC_OFFSET, &RING_MAGIC.to_le_bytes());
        mem.write_at(CAPACITY_OFFSET, &capacity.to_le_bytes());
        Ok(RingReceiver { mem: Arc::new(mem), cap: capacity, head: 0 })
    }

    /// A handle that tells, without the receiver's lock, whether records are waiting.
    pub fn watch(&self) -> RingWatch {
        RingWatch { mem: self.mem.clone(), cap: self.cap }
    }

    /// The memory to hand to the sender.
    pub fn mem(&self) -> &SharedMem {
        &self.mem
    }

    /// True when no record is waiting.
    #[inline]
    pub fn is_empty(&self) -> bool {
        stamp_at(&self.mem, self.cap, self.head) != stamp(self.head)
    }

    /// The next record: its kind, where its payload is in the mapping, its length, and the
    /// bytes it takes in the ring. `None` when the ring is empty.
    fn next_record(&mut self) -> Result<Option<(u32, u64, usize, u64)>, ShmError> {
        loop {
            let idx = self.head & (self.cap - 1);
            if stamp_at(&self.mem, self.cap, self.head) != stamp(self.head) {
                return Ok(None);
            }
            // The stamp was loaded with acquire ordering: the rest of the record is visible.
            let contiguous = self.cap - idx;
            let mut hdr = [0u8; 8];
            self.mem.read_at(DATA_OFFSET + idx + 8, &mut hdr);
            let len = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as u64;
            let kind = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
            if kind == KIND_PAD {
                self.advance(contiguous);
                continue;
            }
            let need = record_bytes(len);
            if need > contiguous || len > payload_bytes_max(self.cap) {
                return Err(ShmError::BadRing("record length out of range"));
            }
            return Ok(Some((kind, DATA_OFFSET + idx + RECORD_HEADER_BYTES, len as usize, need)));
        }
    }

    /// Take the next record, copying its payload into `out`. Returns its kind, or `None` when
    /// the ring is empty. An error means the sender broke the ring; the connection must go.
    pub fn pop(&mut self, out: &mut Vec<u8>) -> Result<Option<u32>, ShmError> {
        let Some((kind, at, len, need)) = self.next_record()? else { return Ok(None) };
        // Every byte is overwritten below: only growth beyond the old length is zeroed.
        out.truncate(len);
        out.resize(len, 0);
        self.mem.read_at(at, out);
        self.advance(need);
        Ok(Some(kind))
    }

    /// Take the next record and hand its payload to `f` where it lies in the ring, without a
    /// copy; the slot is given back to the sender when `f` returns.
    pub fn pop_with<R>(&mut self, f: impl FnOnce(u32, &[u8]) -> R) -> Result<Option<R>, ShmError> {
        let Some((kind, at, len, need)) = self.next_record()? else { return Ok(None) };
        // SAFETY: `next_record` checked that `at..at + len` lies inside the mapping (within
        // the ring's data area), which lives as long as `self.mem`, borrowed for the whole
        // call. The record was published by its stamp (acquire-loaded) and the sender reuses
        // its bytes only after our head passes them, which `advance` does after `f` returns;
        // a sender that breaks that rule can change only the bytes of its own message.
        #[allow(unsafe_code)]
        let payload = unsafe { std::slice::from_raw_parts(self.mem.as_ptr().add(at as usize), len) };
        let r = f(kind, payload);
        self.advance(need);
        Ok(Some(r))
    }

    fn advance(&mut self, by: u64) {
        self.head = self.head.wrapping_add(by);
        atomic(&self.mem, HEAD_OFFSET).store(self.head, Ordering::Release);
    }
}

/// Tells whether a ring has records waiting, from any thread and without taking the
/// receiver's lock: pollers look here first and lock only when there is something to take.
/// Only a hint (the sender can write the indices): [`RingReceiver::pop`] still checks all.
#[derive(Debug, Clone)]
pub struct RingWatch {
    mem: Arc<SharedMem>,
    cap: u64,
}

impl RingWatch {
    /// True when the ring looks non-empty.
    #[inline]
    pub fn pending(&self) -> bool {
        let head = atomic(&self.mem, HEAD_OFFSET).load(Ordering::Relaxed);
        stamp_at(&self.mem, self.cap, head) == stamp(head)
    }
}

/// The stamp word of the record slot at stream position `pos`.
#[inline]
fn stamp_at(mem: &SharedMem, cap: u64, pos: u64) -> u64 {
    atomic(mem, slot_offset(cap, pos)).load(Ordering::Acquire)
}

/// The sending side of a ring, attached to memory the receiver sent.
#[derive(Debug)]
pub struct RingSender {
    mem: SharedMem,
    cap: u64,
    tail: u64,
    cached_head: u64,
    /// How often the shared head had to be re-read because the ring looked full.
    pub head_refreshes: u64,
    /// Records published so far (padding not counted): a plain count under whatever guards
    /// the sender, where a shared atomic counter would cost an atomic instruction a record.
    pub records: u64,
}

impl RingSender {
    /// Attach to a ring the receiver created. The header is checked, not trusted.
    pub fn attach(mem: SharedMem) -> Result<Self, ShmError> {
        if mem.access() != MapAccess::ReadWrite {
            return Err(ShmError::BadRing("ring mapped read-only"));
        }
        let cap = capacity_of(&mem)?;
        // The sender's own mapping faults in now too, not at its first pass through the ring.
        mem.prefault();
        // A ring is handed to its one sender before anything is written to it. The head is the
        // receiver's word: a record position is aligned, whatever it says.
        let head = atomic(&mem, HEAD_OFFSET).load(Ordering::Acquire) & !(RECORD_ALIGN - 1);
        Ok(RingSender { mem, cap, tail: head, cached_head: head, head_refreshes: 0, records: 0 })
    }

    /// The largest payload this ring accepts.
    pub fn payload_max(&self) -> u64 {
        payload_bytes_max(self.cap)
    }

    /// Append one record made of `parts` (concatenated) and publish it.
    pub fn push(&mut self, kind: u32, parts: &[&[u8]]) -> Result<(), PushError> {
        debug_assert_ne!(kind, KIND_PAD);
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if len > self.payload_max() {
            return Err(PushError::TooLarge { len, max: self.payload_max() });
        }
        let need = record_bytes(len);
        let idx = self.tail & (self.cap - 1);
        let contiguous = self.cap - idx;
        let pad = if need > contiguous { contiguous } else { 0 };
        if !self.has_room(pad + need) {
            return Err(PushError::Full);
        }
        if pad > 0 {
            self.write_header(idx, KIND_PAD, pad - RECORD_HEADER_BYTES);
            self.tail = self.tail.wrapping_add(pad);
        }
        let idx = self.tail & (self.cap - 1);
        let mut off = DATA_OFFSET + idx + RECORD_HEADER_BYTES;
        for p in parts {
            self.mem.write_at(off, p);
            off += p.len() as u64;
        }
        self.write_header(idx, kind, len);
        self.tail = self.tail.wrapping_add(need);
        self.records += 1;
        Ok(())
    }

    /// Append one record whose payload `fill` writes in place, into up to `max` bytes of the
    /// ring (a device read straight into the receiver's memory, with no buffer between), and
    /// publish it with the length `fill` returns; `None` from `fill` publishes nothing and
    /// leaves the ring as it was. Room for `max` bytes is needed, whatever `fill` then writes.
    /// Returns the length published.
    pub fn push_with(
        &mut self,
        kind: u32,
        max: u64,
        fill: impl FnOnce(&mut [u8]) -> Option<usize>,
    ) -> Result<Option<usize>, PushError> {
        debug_assert_ne!(kind, KIND_PAD);
        if max > self.payload_max() {
            return Err(PushError::TooLarge { len: max, max: self.payload_max() });
        }
        let idx = self.tail & (self.cap - 1);
        let contiguous = self.cap - idx;
        let pad = if record_bytes(max) > contiguous { contiguous } else { 0 };
        if !self.has_room(pad + record_bytes(max)) {
            return Err(PushError::Full);
        }
        // Where the record goes: here, or at the ring's start behind a padding record.
        let at = self.tail.wrapping_add(pad) & (self.cap - 1);
        let off = (DATA_OFFSET + at + RECORD_HEADER_BYTES) as usize;
        debug_assert!(off + max as usize <= self.mem.len());
        // SAFETY: `off..off + max` lies inside the mapping: the record fits before the end of
        // the data area (`pad` moved it to the start otherwise), which the mapping holds
        // (checked at attach). The bytes are past the tail, so the receiver reads none of them
        // until the stamp below publishes them (its own stamp word, at `at`, is outside the
        // slice); `has_room` made sure the receiver drained them. The slice lives only for
        // `fill`, while `self` (and with it the mapping) is borrowed mutably.
        #[allow(unsafe_code)]
        let slot = unsafe { std::slice::from_raw_parts_mut(self.mem.as_ptr().add(off), max as usize) };
        let Some(len) = fill(slot).filter(|&n| n as u64 <= max) else {
            return Ok(None);
        };
        if pad > 0 {
            self.write_header(idx, KIND_PAD, pad - RECORD_HEADER_BYTES);
            self.tail = self.tail.wrapping_add(pad);
        }
        self.write_header(at, kind, len as u64);
        self.tail = self.tail.wrapping_add(record_bytes(len as u64));
        self.records += 1;
        Ok(Some(len))
    }

    /// Write the length and kind, then publish the record with its stamp (release: whoever
    /// sees the stamp sees everything written before it).
    fn write_header(&self, idx: u64, kind: u32, len: u64) {
        let mut hdr = [0u8; 8];
        hdr[..4].copy_from_slice(&(len as u32).to_le_bytes());
        hdr[4..].copy_from_slice(&kind.to_le_bytes());
        self.mem.write_at(DATA_OFFSET + idx + 8, &hdr);
        atomic(&self.mem, DATA_OFFSET + idx).store(stamp(self.tail), Ordering::Release);
    }

    fn has_room(&mut self, bytes: u64) -> bool {
        if self.tail.wrapping_sub(self.cached_head) + bytes <= self.cap {
            return true;
        }
        self.head_refreshes += 1;
        let head = atomic(&self.mem, HEAD_OFFSET).load(Ordering::Acquire);
        // A head that claims more was consumed than was written is the receiver's bug;
        // treat it as no room rather than overwrite unread records.
        if self.tail.wrapping_sub(head) > self.cap {
            return false;
        }
        self.cached_head = head;
        self.tail.wrapping_sub(self.cached_head) + bytes <= self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn pair(cap: u64) -> (RingSender, RingReceiver) {
        let rx = RingReceiver::create("r", cap).unwrap();
        let fd = rustix::io::dup(rx.mem().fd()).unwrap();
        let tx = RingSender::attach(SharedMem::from_fd(fd, MapAccess::ReadWrite).unwrap()).unwrap();
        (tx, rx)
    }

    /// Take up to `n` records (all waiting, with `usize::MAX`), each checked against the oldest
    /// record still expected: same kind, same bytes.
    fn take_expected(
        rx: &mut RingReceiver,
        expected: &mut std::collections::VecDeque<(u32, Vec<u8>)>,
        n: usize,
    ) -> Result<(), TestCaseError> {
        let mut out = Vec::new();
        for _ in 0..n {
            let Some((k, p)) = expected.pop_front() else { break };
            prop_assert_eq!(rx.pop(&mut out).unwrap(), Some(k));
            prop_assert_eq!(&out, &p);
        }
        Ok(())
    }

    // Checks, over random sequences of record sizes and drain points, that every record comes
    // out once, in order, byte-exact, including across wrap-around, that Full is reported
    // exactly when unread bytes leave no room (nothing is ever overwritten), and that the
    // sender's count of records is the number pushed.
    proptest! {
        #[test]
        fn records_round_trip_in_order(sizes in proptest::collection::vec(0usize..1500, 1..300), drain_every in 1usize..20) {
            let (mut tx, mut rx) = pair(4096);
            let mut expected = std::collections::VecDeque::new();
            for (i, &n) in sizes.iter().enumerate() {
                let payload: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
                loop {
                    match tx.push(i as u32, &[&payload]) {
                        Ok(()) => { expected.push_back((i as u32, payload.clone())); break; }
                        Err(PushError::Full) => {
                            prop_assert!(!expected.is_empty(), "full ring must hold something");
                            take_expected(&mut rx, &mut expected, 1)?;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                if i % drain_every == 0 {
                    take_expected(&mut rx, &mut expected, usize::MAX)?;
                }
            }
            take_expected(&mut rx, &mut expected, usize::MAX)?;
            prop_assert_eq!(rx.pop(&mut Vec::new()).unwrap(), None);
            // The sender counted each record once (padding records not among them).
            prop_assert_eq!(tx.records, sizes.len() as u64);
        }
    }

    // Checks records written in place: over random sizes, room asked beyond the size, and
    // drain points, every record comes out once, in order, byte-exact, across wrap-around;
    // a fill that gives up (every few records, before the real one) publishes nothing and
    // leaves no trace (the receiver finds exactly the records written); Full is reported only
    // when the unread records leave no room for the room asked.
    proptest! {
        #[test]
        fn records_written_in_place_round_trip(
            sizes in proptest::collection::vec((0usize..1500, 0u64..600), 1..300),
            drain_every in 1usize..20,
            give_up_every in 1usize..7,
        ) {
            let (mut tx, mut rx) = pair(4096);
            let mut expected = std::collections::VecDeque::new();
            for (i, &(n, extra)) in sizes.iter().enumerate() {
                let payload: Vec<u8> = (0..n).map(|j| (i * 17 + j) as u8).collect();
                let max = (n as u64 + extra).min(tx.payload_max());
                loop {
                    if i % give_up_every == 0 {
                        match tx.push_with(i as u32, max, |slot| { slot.fill(0xee); None }) {
                            Ok(None) | Err(PushError::Full) => {}
                            other => panic!("a fill that gave up: {other:?}"),
                        }
                    }
                    let fill = |slot: &mut [u8]| { slot[..n].copy_from_slice(&payload); Some(n) };
                    match tx.push_with(i as u32, max, fill) {
                        Ok(Some(len)) => {
                            prop_assert_eq!(len, n);
                            expected.push_back((i as u32, payload.clone()));
                            break;
                        }
                        Err(PushError::Full) => {
                            prop_assert!(!expected.is_empty(), "full ring must hold something");
                            take_expected(&mut rx, &mut expected, 1)?;
                        }
                        other => panic!("{other:?}"),
                    }
                }
                if i % drain_every == 0 {
                    take_expected(&mut rx, &mut expected, usize::MAX)?;
                }
            }
            take_expected(&mut rx, &mut expected, usize::MAX)?;
            prop_assert_eq!(rx.pop(&mut Vec::new()).unwrap(), None);
            // Counted: each record published once; fills that gave up, and padding, not at all.
            prop_assert_eq!(tx.records, sizes.len() as u64);
        }
    }

    // Checks that a faulty sender that writes a bogus length is reported as a broken ring
    // instead of making the receiver read out of bounds or panic.
    #[test]
    fn bogus_record_header_is_reported() {
        let (mut tx, mut rx) = pair(4096);
        tx.push(1, &[b"abc"]).unwrap();
        // Corrupt the length field of the first record through the sender's view.
        tx.mem.write_at(DATA_OFFSET + 8, &u32::MAX.to_le_bytes());
        let mut out = Vec::new();
        assert!(matches!(rx.pop(&mut out), Err(ShmError::BadRing(_))));
    }

    // Checks that taking records in place hands over the same kinds and bytes as copying
    // them out, across the wrap of the ring, and frees their room for the sender.
    #[test]
    fn records_taken_in_place_match() {
        let (mut tx, mut rx) = pair(4096);
        let mut out = Vec::new();
        for i in 0..200u32 {
            let payload: Vec<u8> = (0..(i as usize * 7) % 1500).map(|j| (i as usize + j) as u8).collect();
            tx.push(i, &[&payload[..payload.len() / 2], &payload[payload.len() / 2..]]).unwrap();
            if i % 2 == 0 {
                let got = rx.pop_with(|k, b| (k, b.to_vec())).unwrap();
                assert_eq!(got, Some((i, payload)));
            } else {
                assert_eq!(rx.pop(&mut out).unwrap(), Some(i));
                assert_eq!(out, payload);
            }
        }
        assert_eq!(rx.pop_with(|_, b| b.len()).unwrap(), None);
    }

    // Checks the size limit: a record above half the ring is refused as TooLarge, written
    // from parts or asked for in place (whose fill is then never called).
    #[test]
    fn oversize_record_is_refused() {
        let (mut tx, _rx) = pair(4096);
        let big = vec![0u8; 4096];
        assert!(matches!(tx.push(1, &[&big]), Err(PushError::TooLarge { .. })));
        let r = tx.push_with(1, 4096, |_| panic!("no room to fill"));
        assert!(matches!(r, Err(PushError::TooLarge { .. })), "{r:?}");
    }

    /// This thread's minor page faults so far (`/proc/thread-self/stat`, its tenth field).
    fn minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 1..];
        after_name.split_whitespace().nth(7).unwrap().parse().unwrap()
    }

    /// Read a byte of every page of `mem`; the faults that took.
    fn faults_touching(mem: &SharedMem) -> u64 {
        let before = minor_faults();
        let mut sum = 0u8;
        for at in (0..mem.len() as u64).step_by(4096) {
            let mut b = [0u8; 1];
            mem.read_at(at, &mut b);
            sum = sum.wrapping_add(b[0]);
        }
        std::hint::black_box(sum);
        minor_faults() - before
    }

    // Checks that a ring's memory is mapped in whole when the receiver makes it and when the
    // sender attaches it: reading every page of either side's mapping afterwards takes (almost)
    // no page fault, counted by this thread's minor faults, where a window mapped the same way
    // without that takes one a page (the control, so the count is known to see faults).
    #[test]
    fn rings_are_mapped_in_whole_on_both_sides() {
        let cap = 1 << 20;
        let pages = (DATA_OFFSET + cap) / 4096;
        let (tx, rx) = pair(cap);
        assert!(faults_touching(&rx.mem) < pages / 8, "the receiver's mapping faulted on touch");
        assert!(faults_touching(&tx.mem) < pages / 8, "the sender's mapping faulted on touch");
        let control = SharedMem::create("control", DATA_OFFSET + cap).unwrap();
        assert!(faults_touching(&control) >= pages / 2, "an unpopulated window faults a page at a time");
    }
}
