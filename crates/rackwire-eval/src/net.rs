//! The two data paths a workload runs over, behind one interface: the fabric (one-sided
//! writes into the receiver's registered memory) and plain TCP sockets between the same
//! processes.
//!
//! Both carry the same two patterns the workloads are made of: an all-to-all exchange of
//! blocks of any sizes (the sort's shuffle) and a gather at one rank (grep's reduce, which is
//! the same exchange with every block but the root's empty). Setup (connections, addresses)
//! goes through the job's group; the phase boundaries use the group's barrier on both paths,
//! so only the data moves differently.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rackwire::Access;
use rackwire_coll::{Group, SymmetricRegion};

use crate::EvalError;

/// Which path the data takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Net {
    /// rackwire: shared memory within a memory domain, the edge transport across.
    Fabric,
    /// The key-value store's requests and replies as messages over the fabric, as over TCP:
    /// the fabric's transport with TCP's algorithm (no one-sided reads), so a comparison can
    /// tell what the transport gains from what one-sided reads gain. The key-value store only.
    FabricRpc,
    /// TCP sockets, one connection per pair of ranks.
    Tcp,
}

impl Net {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Net::Fabric => "fabric",
            Net::FabricRpc => "fabric-rpc",
            Net::Tcp => "tcp",
        }
    }

    /// The path a name on the command line means.
    pub fn parse(s: &str) -> Result<Net, EvalError> {
        match s {
            "fabric" => Ok(Net::Fabric),
            "fabric-rpc" => Ok(Net::FabricRpc),
            "tcp" => Ok(Net::Tcp),
            other => Err(EvalError::BadArgument(format!("unknown data path {other:?} (fabric, fabric-rpc or tcp)"))),
        }
    }

    /// The paths a workload compares unless told otherwise: the key-value store adds its
    /// requests over the fabric ([`Net::FabricRpc`]).
    pub fn defaults(workload: &str) -> &'static [Net] {
        match workload {
            "kv" => &[Net::Fabric, Net::FabricRpc, Net::Tcp],
            _ => &[Net::Fabric, Net::Tcp],
        }
    }

    /// Whether `workload` runs over this path.
    pub fn carries(self, workload: &str) -> bool {
        self != Net::FabricRpc || workload == "kv"
    }
}

/// How long a rank waits for TCP connections from the others to arrive.
pub const TCP_SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one TCP exchange may stall (no byte moving) before it fails.
pub const TCP_STALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of one block's length on the TCP path.
const LEN_BYTES: usize = 8;

/// Moves a job's data between its ranks.
pub trait DataPath {
    /// What the rows call this path: `shm` or `udp` (the fabric's transport to the other
    /// ranks), or `tcp`.
    fn transport(&self) -> &'static str;

    /// Rank `i` sends `counts[j]` bytes to rank `j` (its own block included), the blocks
    /// packed by rank in `send`, and gets back what every rank sent it, by rank, packed into
    /// one buffer with the offsets of each rank's block (`offsets[r]..offsets[r + 1]`).
    fn exchange(&mut self, g: &mut Group, send: &[u8], counts: &[usize]) -> Result<Received<'_>, EvalError>;

    /// Set up, before the timed run, to receive up to `bytes` in one exchange (more still
    /// works, with the setup then done inside the exchange). Collective.
    fn prepare(&mut self, g: &mut Group, bytes: u64) -> Result<(), EvalError> {
        let _ = (g, bytes);
        Ok(())
    }

    /// Every rank's `data` gathered at `root`, packed by rank (`None` at the other ranks).
    fn gather(&mut self, g: &mut Group, root: usize, data: &[u8]) -> Result<Option<Received<'_>>, EvalError> {
        let counts: Vec<usize> = (0..g.size()).map(|r| if r == root { data.len() } else { 0 }).collect();
        let got = self.exchange(g, data, &counts)?;
        Ok((g.rank() == root).then_some(got))
    }
}

/// What one exchange delivered: every rank's block, packed by rank, where it landed: in
/// this rank's registered memory (the fabric: read in place, no copy out) or in a buffer
/// (TCP).
#[derive(Debug)]
pub struct Received<'a> {
    landed: Landed<'a>,
    /// Where each rank's block starts, and the end (one more than ranks).
    pub offsets: Vec<usize>,
}

#[derive(Debug)]
enum Landed<'a> {
    Buffer(Vec<u8>),
    Region(&'a rackwire::Region),
}

/// Bytes copied at a time when received data is streamed out.
const STREAM_CHUNK: usize = 1 << 20;

impl Received<'_> {
    /// Bytes received in all.
    pub fn len(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// Nothing was received.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copy the received bytes at `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), EvalError> {
        if offset.checked_add(out.len()).is_none_or(|end| end > self.len()) {
            return Err(EvalError::BadArgument(format!("read of {} bytes at {offset} past {}", out.len(), self.len())));
        }
        match &self.landed {
            Landed::Buffer(b) => out.copy_from_slice(&b[offset..offset + out.len()]),
            Landed::Region(r) => r.read_at(offset as u64, out)?,
        }
        Ok(())
    }

    /// Hand every received byte, in order, to `f`, a chunk at a time (up to `chunk` bytes,
    /// rounded down to a multiple of `unit` so no unit is split).
    pub fn for_each_chunk(
        &self,
        unit: usize,
        mut f: impl FnMut(usize, &[u8]) -> Result<(), EvalError>,
    ) -> Result<(), EvalError> {
        let step = (STREAM_CHUNK / unit).max(1) * unit;
        match &self.landed {
            Landed::Buffer(b) => {
                for (i, c) in b[..self.len()].chunks(step).enumerate() {
                    f(i * step, c)?;
                }
            }
            Landed::Region(_) => {
                let mut buf = vec![0u8; step.min(self.len())];
                let mut at = 0;
                while at < self.len() {
                    let k = step.min(self.len() - at);
                    self.read_at(at, &mut buf[..k])?;
                    f(at, &buf[..k])?;
                    at += k;
                }
            }
        }
        Ok(())
    }

    /// Everything received, as one buffer.
    pub fn to_vec(&self) -> Result<Vec<u8>, EvalError> {
        match &self.landed {
            Landed::Buffer(b) => Ok(b[..self.len()].to_vec()),
            Landed::Region(_) => {
                let mut v = vec![0u8; self.len()];
                self.read_at(0, &mut v)?;
                Ok(v)
            }
        }
    }
}

/// `send` split into the blocks `counts` give, after checking that they fit together.
fn blocks<'a>(send: &'a [u8], counts: &[usize], n: usize) -> Result<Vec<&'a [u8]>, EvalError> {
    if counts.len() != n || counts.iter().sum::<usize>() != send.len() {
        return Err(EvalError::BadArgument(format!(
            "exchange: {} counts summing to {} for {n} ranks and {} bytes",
            counts.len(),
            counts.iter().sum::<usize>(),
            send.len()
        )));
    }
    let mut rest = send;
    Ok(counts
        .iter()
        .map(|&c| {
            let (head, tail) = rest.split_at(c);
            rest = tail;
            head
        })
        .collect())
}

fn offsets_of(counts: &[usize]) -> Vec<usize> {
    let mut offs = Vec::with_capacity(counts.len() + 1);
    offs.push(0);
    for c in counts {
        offs.push(offs.last().copied().unwrap_or(0) + c);
    }
    offs
}

/// The exchange over the fabric: block sizes first (an all-to-all of counts), then every
/// block written by its sender straight into the receiver's registered memory (a region
/// every rank allocates for the exchange, [`Group::alltoallv_to`]), which the receiver then
/// reads out.
pub struct FabricPath {
    transport: &'static str,
    /// The receive region, registered ahead (see [`DataPath::prepare`]).
    region: Option<SymmetricRegion>,
}

/// Bytes written at a time when a receive region is touched ahead.
const TOUCH_CHUNK: usize = 1 << 20;

/// A symmetric region as long as the most any rank expects to receive, with the pages this
/// rank expects to fill (`bytes`) in memory, as memory registered for RDMA is pinned: the
/// writes into it then take no page faults on this side.
fn registered(g: &mut Group, bytes: u64) -> Result<SymmetricRegion, EvalError> {
    let mut most = [bytes];
    g.allreduce(&mut most, rackwire_coll::ReduceOp::Max)?;
    let region = g.alloc_symmetric(most[0].max(1), Access::READ | Access::WRITE)?;
    let zeros = vec![0u8; TOUCH_CHUNK];
    let mut at = 0u64;
    while at < bytes {
        let k = (bytes - at).min(TOUCH_CHUNK as u64);
        region.region.write_at(at, &zeros[..k as usize])?;
        at += k;
    }
    Ok(region)
}

/// One exchange of zeros with these block sizes, before the clock starts, on either path (as
/// the OSU method warms up before it times): connections, windows and mappings are in use
/// when the timed exchange comes.
pub fn warm_up(path: &mut dyn DataPath, g: &mut Group, counts: &[usize]) -> Result<(), EvalError> {
    let zeros = vec![0u8; counts.iter().sum()];
    path.exchange(g, &zeros, counts).map(drop)
}

impl FabricPath {
    /// The fabric path of this group's job.
    pub fn new(g: &Group) -> FabricPath {
        // The transport to the farthest peer names the path: on a rack with two memory
        // domains some peers are on shared memory and some on the edge transport.
        let transport = (0..g.size())
            .filter(|&r| r != g.rank())
            .filter_map(|r| g.transport(r))
            .find(|&t| t != "shm")
            .unwrap_or("shm");
        FabricPath { transport: if transport == "edge" { "udp" } else { transport }, region: None }
    }
}

impl DataPath for FabricPath {
    fn transport(&self) -> &'static str {
        self.transport
    }

    fn prepare(&mut self, g: &mut Group, bytes: u64) -> Result<(), EvalError> {
        self.region = Some(registered(g, bytes)?);
        Ok(())
    }

    fn exchange(&mut self, g: &mut Group, send: &[u8], send_counts: &[usize]) -> Result<Received<'_>, EvalError> {
        let n = g.size();
        blocks(send, send_counts, n)?;
        let mut counts_out = Vec::with_capacity(8 * n);
        for c in send_counts {
            counts_out.extend_from_slice(&(*c as u64).to_le_bytes());
        }
        let mut counts_in = vec![0u8; 8 * n];
        g.alltoall(&counts_out, &mut counts_in)?;
        let recv_counts: Vec<usize> =
            counts_in.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")) as usize).collect();
        let offsets = offsets_of(&recv_counts);
        // Every rank allocates the same length: the most any rank receives.
        let mut most = [offsets[n] as u64];
        g.allreduce(&mut most, rackwire_coll::ReduceOp::Max)?;
        // The region registered ahead when it is large enough on every rank (they all decide
        // alike: they all know the largest need), else a larger one now.
        if self.region.as_ref().is_none_or(|r| r.region.len() < most[0]) {
            self.region = None;
            self.region = Some(g.alloc_symmetric(most[0].max(1), Access::READ | Access::WRITE)?);
        }
        let region = self.region.as_ref().expect("set above");
        g.alltoallv_to(send, send_counts, region, 0, &recv_counts)?;
        Ok(Received { landed: Landed::Region(&region.region), offsets })
    }
}

/// The exchange over TCP, built as a good socket program would build it: one connection per
/// pair of ranks, set up once (each rank listens on its own address, learns the others'
/// through the group, connects to every higher rank and accepts every lower one);
/// `TCP_NODELAY` on, socket buffers left to the kernel's autotuning (setting them fixes them
/// and turns autotuning off); one thread per rank driving every connection at once with
/// non-blocking sockets and `poll`, as Open MPI's TCP transport does, so no peer waits while
/// another could move; large writes and reads straight from and into the final buffers. The
/// lengths go first (8 bytes each way per pair), then the blocks.
pub struct TcpPath {
    /// The connection to each rank (none to itself).
    socks: Vec<Option<TcpStream>>,
}

impl TcpPath {
    /// Connect every pair of ranks of the group. `bind` is this rank's address to listen on
    /// (port 0: any).
    pub fn connect(g: &mut Group, bind: &TcpBind) -> Result<TcpPath, EvalError> {
        Ok(TcpPath { socks: tcp_mesh(g, bind)? })
    }
}

/// One TCP connection between every pair of ranks, non-blocking, `TCP_NODELAY` on: each rank
/// listens on `bind`, learns the others' addresses through the group, connects to every
/// higher rank (saying its rank first) and accepts every lower one.
pub(crate) fn tcp_mesh(g: &mut Group, bind: &TcpBind) -> Result<Vec<Option<TcpStream>>, EvalError> {
    let (me, n) = (g.rank(), g.size());
    let listener = {
        let s = tcp_socket(bind)?;
        s.set_reuse_address(true).map_err(|e| EvalError::Tcp(e.to_string()))?;
        s.bind(&bind.addr.into()).map_err(|e| EvalError::Tcp(format!("listen on {}: {e}", bind.addr)))?;
        s.listen(n as i32).map_err(|e| EvalError::Tcp(format!("listen on {}: {e}", bind.addr)))?;
        TcpListener::from(s)
    };
    let addr = listener.local_addr().map_err(|e| EvalError::Tcp(e.to_string()))?;
    let posted = g.allgather_blobs(addr.to_string().as_bytes())?;
    let addrs: Vec<SocketAddr> = posted
        .iter()
        .map(|b| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| EvalError::Tcp("a rank posted a bad address".into()))
        })
        .collect::<Result<_, _>>()?;
    let mut socks: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    for (r, a) in addrs.iter().enumerate().skip(me + 1) {
        let s = tcp_socket(bind)?;
        s.bind(&SocketAddr::new(bind.addr.ip(), 0).into())
            .map_err(|e| EvalError::Tcp(format!("bind to {}: {e}", bind.addr.ip())))?;
        s.connect_timeout(&(*a).into(), TCP_SETUP_TIMEOUT)
            .map_err(|e| EvalError::Tcp(format!("connect to rank {r} at {a}: {e}")))?;
        let mut s = TcpStream::from(s);
        s.write_all(&(me as u32).to_le_bytes()).map_err(|e| EvalError::Tcp(e.to_string()))?;
        socks[r] = Some(s);
    }
    listener.set_nonblocking(true).map_err(|e| EvalError::Tcp(e.to_string()))?;
    let deadline = Instant::now() + TCP_SETUP_TIMEOUT;
    let mut missing = me;
    while missing > 0 {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false).map_err(|e| EvalError::Tcp(e.to_string()))?;
                s.set_read_timeout(Some(TCP_SETUP_TIMEOUT)).map_err(|e| EvalError::Tcp(e.to_string()))?;
                let mut who = [0u8; 4];
                s.read_exact(&mut who).map_err(|e| EvalError::Tcp(format!("a peer's first bytes: {e}")))?;
                let r = u32::from_le_bytes(who) as usize;
                if r >= me || socks[r].is_some() {
                    return Err(EvalError::Tcp(format!("unexpected connection claiming rank {r}")));
                }
                socks[r] = Some(s);
                missing -= 1;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(EvalError::Tcp(format!("{missing} lower rank(s) never connected")));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(EvalError::Tcp(format!("accept: {e}"))),
        }
    }
    for s in socks.iter().flatten() {
        s.set_nodelay(true).map_err(|e| EvalError::Tcp(e.to_string()))?;
        s.set_nonblocking(true).map_err(|e| EvalError::Tcp(e.to_string()))?;
    }
    Ok(socks)
}

impl TcpPath {
    /// Send `out[r]` to and receive into `into[r]` from every other rank at once, until all is
    /// moved.
    fn move_all(&mut self, out: &[&[u8]], into: &mut [&mut [u8]]) -> Result<(), EvalError> {
        let n = self.socks.len();
        let mut sent = vec![0usize; n];
        let mut got = vec![0usize; n];
        let mut last_progress = Instant::now();
        loop {
            let mut progress = false;
            let mut waiting = false;
            for r in 0..n {
                let Some(s) = self.socks[r].as_mut() else { continue };
                while sent[r] < out[r].len() {
                    match s.write(&out[r][sent[r]..]) {
                        Ok(0) => return Err(EvalError::Tcp(format!("rank {r} closed its connection"))),
                        Ok(k) => {
                            sent[r] += k;
                            progress = true;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(EvalError::Tcp(format!("send to rank {r}: {e}"))),
                    }
                }
                while got[r] < into[r].len() {
                    match s.read(&mut into[r][got[r]..]) {
                        Ok(0) => return Err(EvalError::Tcp(format!("rank {r} closed its connection"))),
                        Ok(k) => {
                            got[r] += k;
                            progress = true;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(EvalError::Tcp(format!("receive from rank {r}: {e}"))),
                    }
                }
                waiting |= sent[r] < out[r].len() || got[r] < into[r].len();
            }
            if !waiting {
                return Ok(());
            }
            if progress {
                last_progress = Instant::now();
                continue;
            }
            if last_progress.elapsed() > TCP_STALL_TIMEOUT {
                return Err(EvalError::Tcp(format!("no byte moved for {TCP_STALL_TIMEOUT:?}")));
            }
            self.wait_ready(&sent, &got, out, into)?;
        }
    }

    /// Sleep in `poll` until a connection with work left can move.
    fn wait_ready(&self, sent: &[usize], got: &[usize], out: &[&[u8]], into: &[&mut [u8]]) -> Result<(), EvalError> {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = Vec::with_capacity(self.socks.len());
        for (r, s) in self.socks.iter().enumerate() {
            let Some(s) = s else { continue };
            let mut want = PollFlags::empty();
            if sent[r] < out[r].len() {
                want |= PollFlags::OUT;
            }
            if got[r] < into[r].len() {
                want |= PollFlags::IN;
            }
            if !want.is_empty() {
                fds.push(PollFd::new(s, want));
            }
        }
        let timeout = rustix::time::Timespec { tv_sec: 1, tv_nsec: 0 };
        match poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
            Err(e) => Err(EvalError::Tcp(format!("poll: {e}"))),
        }
    }
}

impl DataPath for TcpPath {
    fn transport(&self) -> &'static str {
        "tcp"
    }

    fn exchange(&mut self, g: &mut Group, send: &[u8], counts: &[usize]) -> Result<Received<'_>, EvalError> {
        let (me, n) = (g.rank(), g.size());
        if self.socks.len() != n {
            return Err(EvalError::BadArgument(format!(
                "exchange: connected to {} ranks, the group has {n}",
                self.socks.len()
            )));
        }
        let send = blocks(send, counts, n)?;
        // The lengths.
        let lens_out: Vec<[u8; LEN_BYTES]> = send.iter().map(|b| (b.len() as u64).to_le_bytes()).collect();
        let mut lens_in = vec![[0u8; LEN_BYTES]; n];
        {
            let out: Vec<&[u8]> = (0..n).map(|r| if r == me { &[][..] } else { &lens_out[r][..] }).collect();
            let mut into: Vec<&mut [u8]> =
                lens_in.iter_mut().enumerate().map(|(r, l)| if r == me { &mut l[..0] } else { &mut l[..] }).collect();
            self.move_all(&out, &mut into)?;
        }
        let counts: Vec<usize> =
            (0..n).map(|r| if r == me { send[me].len() } else { u64::from_le_bytes(lens_in[r]) as usize }).collect();
        let offsets = offsets_of(&counts);
        let mut data = vec![0u8; offsets[n]];
        // The blocks, straight into place; this rank's own block is a copy.
        {
            let mut rest = &mut data[..];
            let mut into: Vec<&mut [u8]> = Vec::with_capacity(n);
            for &c in &counts {
                let (head, tail) = rest.split_at_mut(c);
                into.push(head);
                rest = tail;
            }
            into[me].copy_from_slice(send[me]);
            into[me] = &mut [];
            let out: Vec<&[u8]> = (0..n).map(|r| if r == me { &[][..] } else { send[r] }).collect();
            self.move_all(&out, &mut into)?;
        }
        Ok(Received { landed: Landed::Buffer(data), offsets })
    }
}

/// Where the TCP path listens and connects from: an address, and the device its sockets are
/// held to, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpBind {
    /// The address (port 0: any).
    pub addr: SocketAddr,
    /// The device (`SO_BINDTODEVICE`).
    pub device: Option<String>,
}

/// This rank's address for the TCP path: the first of the links the environment gives the
/// fabric (`RACKWIRE_LINKS`: on a virtual rack, the host's rail addresses), held to that
/// rail's device (`RACKWIRE_LINK_DEVS`) so TCP crosses the shaped rail itself and not `rw0`,
/// which routes the other hosts' addresses over the fabric; else loopback.
pub fn tcp_bind_from_env() -> TcpBind {
    let addr = std::env::var(rackwire::vars::LINKS)
        .ok()
        .and_then(|l| l.split(',').next().and_then(|a| a.trim().parse::<SocketAddr>().ok()))
        .map(|mut a| {
            a.set_port(0);
            a
        });
    match addr {
        Some(addr) => TcpBind {
            addr,
            device: std::env::var(rackwire::vars::LINK_DEVS)
                .ok()
                .and_then(|d| d.split(',').next().map(|d| d.trim().to_string()))
                .filter(|d| !d.is_empty()),
        },
        None => TcpBind { addr: SocketAddr::from(([127, 0, 0, 1], 0)), device: None },
    }
}

/// A TCP socket for `bind`, held to its device if it has one.
fn tcp_socket(bind: &TcpBind) -> Result<socket2::Socket, EvalError> {
    let s = socket2::Socket::new(socket2::Domain::for_address(bind.addr), socket2::Type::STREAM, None)
        .map_err(|e| EvalError::Tcp(format!("socket: {e}")))?;
    if let Some(d) = &bind.device {
        s.bind_device(Some(d.as_bytes())).map_err(|e| EvalError::Tcp(format!("hold to device {d} (root): {e}")))?;
    }
    Ok(s)
}
