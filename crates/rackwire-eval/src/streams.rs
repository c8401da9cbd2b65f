//! Ordered message streams between every pair of ranks, for the workloads that are not made
//! of collective steps (replicated block writes, key-value requests): each rank sends to any
//! other when it likes and takes what arrives from any.
//!
//! Over the **fabric** a stream is a ring in the receiver's registered memory, written by its
//! one sender with one-sided writes: the message, then the ring's tail word set behind it
//! (a write with a signal, fenced behind the message). The receiver sees the tail move with
//! a load from its own memory, reads the message in place, and now and then writes how far
//! it has read into the sender's memory, which gives the sender room. No target CPU takes part
//! in placing a message, and over shared memory every step is a store or a load.
//!
//! Over **TCP** a stream is the connection between the two ranks (the same mesh as
//! [`crate::net::TcpPath`]), each message prefixed by its length, every socket non-blocking
//! and driven from one loop.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;

use rackwire::{Access, Op, OpFlags, Pinned, RemoteRegion, Signal};
use rackwire_coll::{Group, SymmetricRegion};

use crate::EvalError;

/// The largest message a stream carries.
pub const MESSAGE_MAX: usize = 256 * 1024;
/// Bytes of each sender's ring at each receiver (fabric), and of the bytes a TCP stream may
/// have queued and unsent before a send waits.
pub const RING_BYTES: u64 = 2 << 20;
/// Operations a rank leaves in flight over the edge transport before it waits for the oldest.
pub const STREAM_OPS_MAX: usize = 1024;
/// Bytes of a message's header in a ring: its length and a marker.
const FRAME_HEADER: u64 = 8;
/// The length a header gives for "the rest of the ring is empty: go on at its start".
const WRAP: u32 = u32::MAX;
/// Bytes of a counter's line.
const LINE: u64 = 64;
/// The receiver tells the sender how far it read after this many bytes.
const CREDIT_EVERY: u64 = RING_BYTES / 4;
const _: () = assert!(MESSAGE_MAX as u64 + 2 * FRAME_HEADER <= RING_BYTES / 2);

/// Messages between the ranks of a job.
pub trait Streams {
    /// What the rows call this path (`shm`, `udp`, `tcp`).
    fn transport(&self) -> &'static str;
    /// Queue `msg` (at most [`MESSAGE_MAX`] bytes) for rank `to`, in order after what was sent
    /// to it before; `false` when there is no room now (take what arrived, then try again).
    fn try_send(&mut self, to: usize, msg: &[u8]) -> Result<bool, EvalError>;
    /// The next message that arrived, from any rank, into `out`; its sender.
    fn try_recv(&mut self, out: &mut Vec<u8>) -> Result<Option<usize>, EvalError>;
    /// Nothing moved: let the others run a little (and drive what waits to be sent).
    fn idle(&mut self) -> Result<(), EvalError>;
    /// Wait until everything sent has been placed.
    fn flush(&mut self) -> Result<(), EvalError>;
}

fn check_len(msg: &[u8]) -> Result<(), EvalError> {
    if msg.len() > MESSAGE_MAX {
        return Err(EvalError::BadArgument(format!("a {}-byte message: at most {MESSAGE_MAX}", msg.len())));
    }
    Ok(())
}

/// Streams over the fabric: rings in each receiver's registered memory.
pub struct FabricStreams {
    me: usize,
    n: usize,
    transport: &'static str,
    region: SymmetricRegion,
    /// Pins for the shared-memory peers (lock-free stores), by rank.
    pins: Vec<Option<Pinned>>,
    /// The connection and region of every other rank.
    peers: Vec<Option<(rackwire::Conn, RemoteRegion)>>,
    /// Bytes this rank placed into each receiver's ring (its tail there).
    sent: Vec<u64>,
    /// How far each receiver said it read this rank's ring (last seen).
    room_seen: Vec<u64>,
    /// Bytes this rank took from each sender's ring.
    taken: Vec<u64>,
    /// `taken` as last told to each sender.
    told: Vec<u64>,
    /// Operations in flight (edge transport).
    ops: VecDeque<Op>,
    /// Messages to itself.
    own: VecDeque<Vec<u8>>,
    /// Where to look first for the next message (round robin).
    next: usize,
    /// The fabric, to drive while waiting (the edge transport moves frames when a waiting
    /// thread drives it, instead of waking its network thread).
    fabric: std::sync::Arc<rackwire::Fabric>,
}

fn tail_at(src: usize) -> u64 {
    src as u64 * LINE
}

fn read_upto_at(n: usize, dst: usize) -> u64 {
    (n + dst) as u64 * LINE
}

fn ring_at(n: usize, src: usize) -> u64 {
    (2 * n as u64 * LINE).next_multiple_of(4096) + src as u64 * RING_BYTES
}

impl FabricStreams {
    /// Set up the streams of this group (collective: every rank allocates its rings).
    pub fn new(g: &mut Group) -> Result<FabricStreams, EvalError> {
        let (me, n) = (g.rank(), g.size());
        let len = ring_at(n, n);
        let region = g.alloc_symmetric(len, Access::READ | Access::WRITE)?;
        let mut pins = Vec::with_capacity(n);
        let mut peers = Vec::with_capacity(n);
        let mut transport = "shm";
        for r in 0..n {
            if r == me {
                pins.push(None);
                peers.push(None);
                continue;
            }
            let conn =
                g.conn(r).cloned().ok_or_else(|| EvalError::BadArgument(format!("no connection to rank {r}")))?;
            let remote =
                region.remote(r).cloned().ok_or_else(|| EvalError::BadArgument(format!("no region of rank {r}")))?;
            if conn.transport() != "shm" {
                transport = "udp";
            }
            pins.push((conn.transport() == "shm").then(|| conn.pin(&remote, Access::WRITE).ok()).flatten());
            peers.push(Some((conn, remote)));
        }
        // Everyone's rings exist before anyone writes into them.
        g.barrier()?;
        Ok(FabricStreams {
            me,
            n,
            transport,
            region,
            pins,
            peers,
            sent: vec![0; n],
            room_seen: vec![0; n],
            taken: vec![0; n],
            told: vec![0; n],
            ops: VecDeque::new(),
            own: VecDeque::new(),
            next: 0,
            fabric: g.fabric().clone(),
        })
    }

    /// Write `data` at `offset` of rank `to`'s region, then, if given, set the word at
    /// `signal` behind it.
    fn put(&mut self, to: usize, offset: u64, data: &[u8], signal: Option<Signal>) -> Result<(), EvalError> {
        if let Some(pin) = self.pins[to].as_mut() {
            let done = match signal {
                Some(s) => pin.write_signal(offset, data, s).map(drop),
                None => pin.write(offset, data),
            };
            match done {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(rank = to, "pin refused: {e}; using the connection");
                    self.pins[to] = None;
                }
            }
        }
        let (conn, remote) = self.peers[to].as_ref().ok_or_else(|| EvalError::BadArgument("put to self".into()))?;
        // Fenced behind every earlier write to this rank: a stream's messages land in order.
        let op = match signal {
            Some(s) => conn.write_signal(remote, offset, data, s, OpFlags::NONE.fence_before()),
            None => conn.write(remote, offset, data, OpFlags::NONE.fence_before()),
        };
        self.track(op)
    }

    fn track(&mut self, mut op: Op) -> Result<(), EvalError> {
        if let Some(r) = op.poll() {
            return r.map(drop).map_err(EvalError::from);
        }
        self.ops.push_back(op);
        while self.ops.len() > STREAM_OPS_MAX {
            self.ops.pop_front().expect("not empty").wait()?;
        }
        self.reap()
    }

    fn reap(&mut self) -> Result<(), EvalError> {
        while let Some(op) = self.ops.front_mut() {
            match op.poll() {
                Some(r) => {
                    r?;
                    self.ops.pop_front();
                }
                None => break,
            }
        }
        Ok(())
    }

    /// Room in `to`'s ring for `need` more bytes, looking at what it said it read if needed.
    fn room(&mut self, to: usize, need: u64) -> Result<bool, EvalError> {
        if self.sent[to] + need - self.room_seen[to] <= RING_BYTES {
            return Ok(true);
        }
        self.room_seen[to] = self.region.region.load_u64(read_upto_at(self.n, to))?;
        Ok(self.sent[to] + need - self.room_seen[to] <= RING_BYTES)
    }
}

impl Streams for FabricStreams {
    fn transport(&self) -> &'static str {
        self.transport
    }

    fn try_send(&mut self, to: usize, msg: &[u8]) -> Result<bool, EvalError> {
        check_len(msg)?;
        if to == self.me {
            self.own.push_back(msg.to_vec());
            return Ok(true);
        }
        if to >= self.n {
            return Err(EvalError::BadArgument(format!("no rank {to}")));
        }
        let frame = FRAME_HEADER + (msg.len() as u64).next_multiple_of(8);
        let pos = self.sent[to] % RING_BYTES;
        // A message never wraps: when it does not fit before the ring's end, the rest of the
        // ring is marked empty and it goes at the start.
        let skip = if pos + frame > RING_BYTES { RING_BYTES - pos } else { 0 };
        if !self.room(to, skip + frame)? {
            return Ok(false);
        }
        let ring = ring_at(self.n, self.me);
        if skip > 0 {
            let end = self.sent[to] + skip;
            self.put(to, ring + pos, &WRAP.to_le_bytes(), Some(Signal::set(tail_at(self.me), end)))?;
            self.sent[to] = end;
        }
        let at = ring + self.sent[to] % RING_BYTES;
        let end = self.sent[to] + frame;
        self.put(to, at, &(msg.len() as u32).to_le_bytes(), None)?;
        self.put(to, at + FRAME_HEADER, msg, Some(Signal::set(tail_at(self.me), end)))?;
        self.sent[to] = end;
        Ok(true)
    }

    fn try_recv(&mut self, out: &mut Vec<u8>) -> Result<Option<usize>, EvalError> {
        if let Some(m) = self.own.pop_front() {
            *out = m;
            return Ok(Some(self.me));
        }
        for k in 0..self.n {
            let src = (self.next + k) % self.n;
            if src == self.me {
                continue;
            }
            let tail = self.region.region.load_u64(tail_at(src))?;
            while self.taken[src] < tail {
                let ring = ring_at(self.n, src);
                let pos = self.taken[src] % RING_BYTES;
                let mut h = [0u8; 4];
                self.region.region.read_at(ring + pos, &mut h)?;
                let len = u32::from_le_bytes(h);
                if len == WRAP {
                    self.taken[src] += RING_BYTES - pos;
                    continue;
                }
                if len as usize > MESSAGE_MAX || pos + FRAME_HEADER + len as u64 > RING_BYTES {
                    return Err(EvalError::WrongOutput(format!("rank {src} wrote a bad frame ({len} bytes at {pos})")));
                }
                out.resize(len as usize, 0);
                self.region.region.read_at(ring + pos + FRAME_HEADER, out)?;
                self.taken[src] += FRAME_HEADER + (len as u64).next_multiple_of(8);
                if self.taken[src] - self.told[src] >= CREDIT_EVERY {
                    self.told[src] = self.taken[src];
                    let v = self.taken[src].to_le_bytes();
                    self.put(src, read_upto_at(self.n, self.me), &v, None)?;
                }
                self.next = (src + 1) % self.n;
                return Ok(Some(src));
            }
        }
        Ok(None)
    }

    fn idle(&mut self) -> Result<(), EvalError> {
        self.reap()?;
        // Drive the edge transport from here (nothing to do over shared memory); with nothing
        // moving, let the other ranks run.
        if !self.fabric.progress() {
            std::thread::yield_now();
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), EvalError> {
        while let Some(op) = self.ops.pop_front() {
            op.wait()?;
        }
        Ok(())
    }
}

/// Streams over TCP: one connection per pair, length-prefixed messages.
pub struct TcpStreams {
    me: usize,
    socks: Vec<Option<TcpStream>>,
    /// Bytes queued for each rank, and how many of them went out.
    out: Vec<(Vec<u8>, usize)>,
    /// Bytes read from each rank, not yet a whole message.
    inbuf: Vec<Vec<u8>>,
    /// Whole messages read, in arrival order.
    ready: VecDeque<(usize, Vec<u8>)>,
    /// Where a socket is read into.
    chunk: Vec<u8>,
}

/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 256 * 1024;

impl TcpStreams {
    /// Connect every pair of ranks (see [`crate::net::TcpPath::connect`] for how).
    pub fn connect(g: &mut Group, bind: &crate::net::TcpBind) -> Result<TcpStreams, EvalError> {
        let socks = crate::net::tcp_mesh(g, bind)?;
        let n = socks.len();
        Ok(TcpStreams {
            me: g.rank(),
            socks,
            out: vec![(Vec::new(), 0); n],
            inbuf: vec![Vec::new(); n],
            ready: VecDeque::new(),
            chunk: vec![0u8; READ_CHUNK],
        })
    }

    /// Write what is queued; read what arrived. True if a byte moved.
    fn drive(&mut self) -> Result<bool, EvalError> {
        let mut moved = false;
        let TcpStreams { socks, out, inbuf, ready, chunk, .. } = self;
        for r in 0..socks.len() {
            let Some(s) = socks[r].as_mut() else { continue };
            let (buf, done) = &mut out[r];
            while *done < buf.len() {
                match s.write(&buf[*done..]) {
                    Ok(0) => return Err(EvalError::Tcp(format!("rank {r} closed its connection"))),
                    Ok(k) => {
                        *done += k;
                        moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(EvalError::Tcp(format!("send to rank {r}: {e}"))),
                }
            }
            if *done == buf.len() {
                buf.clear();
                *done = 0;
            }
            loop {
                match s.read(chunk) {
                    Ok(0) => break,
                    Ok(k) => {
                        inbuf[r].extend_from_slice(&chunk[..k]);
                        moved = true;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(EvalError::Tcp(format!("receive from rank {r}: {e}"))),
                }
            }
            // Whole messages out of what was read.
            let ib = &mut inbuf[r];
            let mut at = 0;
            while ib.len() - at >= 4 {
                let len = u32::from_le_bytes(ib[at..at + 4].try_into().expect("4 bytes")) as usize;
                if len > MESSAGE_MAX {
                    return Err(EvalError::WrongOutput(format!("rank {r} sent a {len}-byte message")));
                }
                if ib.len() - at - 4 < len {
                    break;
                }
                ready.push_back((r, ib[at + 4..at + 4 + len].to_vec()));
                at += 4 + len;
            }
            ib.drain(..at);
        }
        Ok(moved)
    }
}

impl Streams for TcpStreams {
    fn transport(&self) -> &'static str {
        "tcp"
    }

    fn try_send(&mut self, to: usize, msg: &[u8]) -> Result<bool, EvalError> {
        check_len(msg)?;
        if to == self.me {
            self.ready.push_back((to, msg.to_vec()));
            return Ok(true);
        }
        if self.socks.get(to).is_none_or(|s| s.is_none()) {
            return Err(EvalError::BadArgument(format!("no rank {to}")));
        }
        if (self.out[to].0.len() - self.out[to].1) as u64 >= RING_BYTES {
            self.drive()?;
            if (self.out[to].0.len() - self.out[to].1) as u64 >= RING_BYTES {
                return Ok(false);
            }
        }
        let buf = &mut self.out[to].0;
        buf.extend_from_slice(&(msg.len() as u32).to_le_bytes());
        buf.extend_from_slice(msg);
        Ok(true)
    }

    fn try_recv(&mut self, out: &mut Vec<u8>) -> Result<Option<usize>, EvalError> {
        if self.ready.is_empty() {
            self.drive()?;
        }
        Ok(self.ready.pop_front().map(|(r, m)| {
            *out = m;
            r
        }))
    }

    fn idle(&mut self) -> Result<(), EvalError> {
        if self.drive()? {
            return Ok(());
        }
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(self.socks.len());
        for (r, s) in self.socks.iter().enumerate() {
            let Some(s) = s else { continue };
            let mut want = PollFlags::IN;
            if self.out[r].1 < self.out[r].0.len() {
                want |= PollFlags::OUT;
            }
            fds.push(PollFd::new(s, want));
        }
        let timeout = rustix::time::Timespec { tv_sec: 0, tv_nsec: 1_000_000 };
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(EvalError::Tcp(format!("poll: {e}"))),
        }
    }

    fn flush(&mut self) -> Result<(), EvalError> {
        while self.out.iter().any(|(b, d)| *d < b.len()) {
            if !self.drive()? {
                self.idle()?;
            }
        }
        Ok(())
    }
}
