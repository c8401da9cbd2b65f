//! UDP links for the rackwire edge transport.
//!
//! One [`LinkSocket`] per link, bound to that link's local address (each rail of a host has its
//! own address). Sends are batched: runs of equal-sized small frames to one peer go out as one
//! segmentation-offload send (UDP GSO) where the kernel has it, other frames with `sendmmsg`,
//! each as two parts (header, and the operation's bytes) so nothing is copied on the way.
//! Links of small frames receive coalesced runs of frames (UDP GRO, with `recvmmsg`); links of
//! large frames take one datagram per system call, as many as are waiting (the quickest path
//! for a lone frame), and a batch tells when it found the socket empty;
//! [`wait`] blocks on several sockets and a [`Waker`] at once for the adaptive mode, while the
//! busy-poll mode simply keeps receiving. [`FaultInjector`] wraps the send path of any link with
//! seeded drop, duplication, reordering and corruption, configured from the environment or the
//! configuration file.

#![deny(unsafe_code)]

mod faults;
mod wait;

pub use faults::{FaultInjector, FaultSpec};
pub use wait::{wait, wait_with, Ready, Waker};

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Mutex;

use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState};

use rustix::net::{MMsgHdr, RecvFlags, SendFlags, SocketAddrAny};

/// `off` (or `0`) in this environment variable: links send without segmentation offload.
pub const GSO_VAR: &str = "RACKWIRE_GSO";
/// `off` (or `0`) in this environment variable: links receive without receive offload.
pub const GRO_VAR: &str = "RACKWIRE_GRO";

/// The largest UDP payload on any link (IPv4, 64 KiB less headers).
pub const UDP_PAYLOAD_MAX: usize = 65507;
/// The smallest frame a link may carry (what [`LinkSocket::bind`] accepts).
pub const FRAME_MIN: usize = 64;
/// Frames one `sendmmsg` call carries at most.
pub const SEND_BATCH_MAX: usize = 64;
/// Socket buffer size asked for (the kernel may cap it).
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;
/// Datagrams one [`LinkSocket::recv_batch`] takes at most.
pub const RECV_BATCH: usize = 16;
/// Links whose frames are at most this large receive with coalescing (GRO).
const GRO_FRAME_MAX: usize = 9000;
/// Buffers one coalescing receive fills at most (each up to 64 KiB of frames).
const GRO_BATCH: usize = 4;
/// Bytes of one coalescing receive buffer.
const GRO_BUFFER_BYTES: usize = 1 << 16;
/// Frames larger than this go out one by one (segmentation offload gains little for them).
const GSO_FRAME_MAX: usize = 16 * 1024;
/// Bytes of one segmentation-offload send (the kernel's limit for one UDP datagram's worth).
const GSO_BYTES_MAX: usize = 65_000;

/// The interface that holds `ip` (from `ip -o addr`), if any.
fn device_of(ip: std::net::IpAddr) -> Option<String> {
    let out = std::process::Command::new("ip").args(["-o", "addr", "show"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let addr = f.get(3)?.split('/').next()?;
        (addr.parse::<std::net::IpAddr>().ok()? == ip).then(|| f[1].trim_end_matches(':').to_string())
    })
}

/// The largest UDP payload interface `dev` carries without IP fragmentation: its MTU less the
/// IP header (20 bytes for IPv4, 40 for IPv6) and the UDP header (8).
fn interface_frame_max(dev: &str, ip: std::net::IpAddr) -> Option<usize> {
    let mtu: usize = std::fs::read_to_string(format!("/sys/class/net/{dev}/mtu")).ok()?.trim().parse().ok()?;
    let ip_header = if ip.is_ipv4() { 20 } else { 40 };
    Some(mtu.saturating_sub(ip_header + 8).min(UDP_PAYLOAD_MAX))
}

/// How many frames from the start of `frames` can go as one segmentation-offload send: same
/// peer, same size (the last may be shorter), small enough, within the kernel's limits.
fn gso_run(frames: &[OutFrame<'_>], gso_max: usize) -> usize {
    let Some(first) = frames.first() else { return 0 };
    run_of(frames.len(), |i| (frames[i].to == first.to).then(|| frames[i].len()), gso_max)
}

/// [`gso_run`] over `count` frames whose lengths `len_of` gives (`None`: the frame cannot join,
/// it goes elsewhere).
fn run_of(count: usize, len_of: impl Fn(usize) -> Option<usize>, gso_max: usize) -> usize {
    let Some(size) = (count > 0).then(|| len_of(0)).flatten() else { return 0 };
    if size == 0 || size > GSO_FRAME_MAX {
        return 1;
    }
    let max = gso_max.min(GSO_BYTES_MAX / size);
    let mut n = 1;
    while n < count && n < max {
        let Some(l) = len_of(n) else { break };
        if l > size {
            break;
        }
        n += 1;
        if l < size {
            break; // a shorter frame ends the run
        }
    }
    n
}

/// One datagram to send: `head` then `body` (either may be empty), to `to`. Two parts, so a
/// frame's header and its operation's bytes go out without being copied together first.
#[derive(Clone, Copy, Debug)]
pub struct OutFrame<'a> {
    /// First part.
    pub head: &'a [u8],
    /// Second part.
    pub body: &'a [u8],
    /// Destination.
    pub to: SocketAddr,
}

impl OutFrame<'_> {
    /// Length of the datagram.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a link's frames go out: its socket, or a wrapper around it that changes what goes
/// (fault injection, tracing, capture), so such concerns wrap a link instead of branching
/// inside the send path.
pub trait SendLink {
    /// Send `frames`, in order; how many went.
    fn send_batch(&mut self, frames: &[OutFrame<'_>]) -> io::Result<usize>;
}

impl SendLink for &LinkSocket {
    fn send_batch(&mut self, frames: &[OutFrame<'_>]) -> io::Result<usize> {
        LinkSocket::send_batch(self, frames)
    }
}

/// A link with seeded faults applied to what it sends (see [`FaultInjector`]). Faults act on
/// whole frames, so each frame's parts are joined first: a test path, not a fast one. It
/// reports the frames it was handed as sent, whatever the faults made of them.
pub struct Faulty<'a, L> {
    /// The link the frames go on.
    pub inner: L,
    /// The faults.
    pub faults: &'a mut FaultInjector,
}

impl<L: SendLink> SendLink for Faulty<'_, L> {
    fn send_batch(&mut self, frames: &[OutFrame<'_>]) -> io::Result<usize> {
        let mut out: Vec<(Vec<u8>, SocketAddr)> = Vec::with_capacity(frames.len());
        let mut made = Vec::new();
        for f in frames {
            let mut whole = f.head.to_vec();
            whole.extend_from_slice(f.body);
            self.faults.apply(&whole, &mut made);
            out.extend(made.drain(..).map(|m| (m, f.to)));
        }
        let list: Vec<OutFrame<'_>> = out.iter().map(|(m, to)| OutFrame { head: m, body: &[], to: *to }).collect();
        self.inner.send_batch(&list)?;
        Ok(frames.len())
    }
}

/// Where a link's frames come in: its socket, or a wrapper around it that changes what
/// arrives (fault injection, tracing, capture), as [`SendLink`] is for what goes out.
pub trait RecvLink {
    /// Receive the frames waiting and hand each to `each` with its sender, as
    /// [`LinkSocket::recv_batch`] does (same contract); how many were taken from the link.
    fn recv_batch<F: FnMut(&[u8], SocketAddr) -> ControlFlow<()>>(
        &mut self,
        bufs: &mut RecvBufs,
        each: F,
    ) -> io::Result<usize>;
}

impl RecvLink for &LinkSocket {
    fn recv_batch<F: FnMut(&[u8], SocketAddr) -> ControlFlow<()>>(
        &mut self,
        bufs: &mut RecvBufs,
        each: F,
    ) -> io::Result<usize> {
        LinkSocket::recv_batch(self, bufs, each)
    }
}

/// Faults applied to what arrives: every frame taken from the link is handed over as the
/// injector makes it (dropped, duplicated, held back, damaged). A test path, not a fast one.
impl<L: RecvLink> RecvLink for Faulty<'_, L> {
    fn recv_batch<F: FnMut(&[u8], SocketAddr) -> ControlFlow<()>>(
        &mut self,
        bufs: &mut RecvBufs,
        mut each: F,
    ) -> io::Result<usize> {
        let faults = &mut *self.faults;
        let mut made = Vec::new();
        self.inner.recv_batch(bufs, |frame, from| {
            faults.apply(frame, &mut made);
            let mut flow = ControlFlow::Continue(());
            for m in made.drain(..) {
                if each(&m, from).is_break() {
                    flow = ControlFlow::Break(());
                }
            }
            flow
        })
    }
}

/// One link: a UDP socket bound to the link's local address.
#[derive(Debug)]
pub struct LinkSocket {
    sock: UdpSocket,
    state: UdpSocketState,
    local: SocketAddr,
    mtu: usize,
    /// Where a run of frames is laid end to end for one segmentation-offload send.
    gso_buf: Mutex<Vec<u8>>,
    gso_off: bool,
    /// Receive-side coalescing (UDP GRO, with `recvmmsg`), for links of small frames: the
    /// state set up on this very socket, which turns GRO on for it.
    gro: Option<UdpSocketState>,
}

/// The buffers for [`LinkSocket::recv_batch`], reused from call to call.
#[derive(Debug)]
pub struct RecvBufs {
    buf: Vec<u8>,
    /// For coalescing receives, made on first use.
    gro: Vec<Vec<u8>>,
    meta: Vec<RecvMeta>,
    drained: bool,
}

impl Default for RecvBufs {
    fn default() -> Self {
        RecvBufs { buf: vec![0u8; UDP_PAYLOAD_MAX + 1], gro: Vec::new(), meta: Vec::new(), drained: true }
    }
}

impl RecvBufs {
    /// Whether the last [`LinkSocket::recv_batch`] found the socket empty before its batch was
    /// full: calling again now would only find it empty once more.
    pub fn drained(&self) -> bool {
        self.drained
    }
}

impl LinkSocket {
    /// Bind to `addr` (port 0 picks one). `mtu` is the largest frame this link carries; where
    /// the interface that holds the address takes less (its MTU less IP and UDP headers), the
    /// link carries that instead (see [`LinkSocket::mtu`]), so that no frame is cut up by IP.
    pub fn bind(addr: &str, mtu: usize) -> io::Result<Self> {
        if !(FRAME_MIN..=UDP_PAYLOAD_MAX).contains(&mtu) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("link MTU {mtu} outside {FRAME_MIN}..={UDP_PAYLOAD_MAX}"),
            ));
        }
        let sock = UdpSocket::bind(addr)?;
        sock.set_nonblocking(true)?;
        // Pin the link to the interface that holds its address, so that host routes through
        // the virtual NIC (which carries IP over this very transport) cannot capture it.
        let ip = sock.local_addr()?.ip();
        let mut mtu = mtu;
        if !ip.is_loopback() && !ip.is_unspecified() {
            if let Some(dev) = device_of(ip) {
                if let Err(e) = socket2::SockRef::from(&sock).bind_device(Some(dev.as_bytes())) {
                    tracing::debug!("link {ip}: not pinned to {dev}: {e}");
                }
                if let Some(fits) = interface_frame_max(&dev, ip) {
                    if fits < FRAME_MIN {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidInput,
                            format!("interface {dev} carries UDP payloads of {fits} bytes, under {FRAME_MIN}"),
                        ));
                    }
                    if fits < mtu {
                        tracing::info!("link {ip}: frames of {fits} bytes, as interface {dev}'s MTU allows");
                        mtu = fits;
                    }
                }
            }
        }
        // As root the limit of net.core.[rw]mem_max does not apply (the _force options).
        use rustix::net::sockopt as so;
        if so::set_socket_recv_buffer_size_force(&sock, SOCKET_BUFFER_BYTES).is_err() {
            let _ = so::set_socket_recv_buffer_size(&sock, SOCKET_BUFFER_BYTES);
        }
        if so::set_socket_send_buffer_size_force(&sock, SOCKET_BUFFER_BYTES).is_err() {
            let _ = so::set_socket_send_buffer_size(&sock, SOCKET_BUFFER_BYTES);
        }
        // What the kernel offers (segmentation offload) is learnt on a scratch socket: setting
        // up the state also turns on receive coalescing (GRO) on the socket it is given, and
        // the link socket keeps plain receives, the quickest for one datagram at a time.
        let scratch = UdpSocket::bind((ip, 0))?;
        let state = UdpSocketState::new(UdpSockRef::from(&scratch))?;
        let local = sock.local_addr()?;
        let off = |var: &str| std::env::var(var).is_ok_and(|v| v == "off" || v == "0");
        let gso_off = off(GSO_VAR);
        // Small frames arrive by the hundred thousand per second: take them coalesced. Jumbo
        // and loopback-sized frames come one per datagram anyway, and a plain receive is the
        // quicker one for a single frame.
        let gro = if mtu <= GRO_FRAME_MAX && !off(GRO_VAR) {
            UdpSocketState::new(UdpSockRef::from(&sock)).ok().filter(|s| s.gro_segments() > 1)
        } else {
            None
        };
        Ok(LinkSocket { sock, state, local, mtu, gso_buf: Mutex::new(Vec::with_capacity(GSO_BYTES_MAX)), gso_off, gro })
    }

    /// Frames one segmentation-offload send may carry (1 where the kernel has none, or where
    /// `RACKWIRE_GSO=off` turns it off).
    pub fn gso_segments_max(&self) -> usize {
        if self.gso_off {
            1
        } else {
            self.state.max_gso_segments()
        }
    }

    /// The bound address (with the port the kernel picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Largest frame.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Send frames in as few system calls as possible, in order. Returns how many went out; a
    /// full socket buffer stops early (the protocol resends what is lost).
    pub fn send_batch(&self, frames: &[OutFrame<'_>]) -> io::Result<usize> {
        let gso_max = self.gso_segments_max();
        let mut sent = 0;
        let mut i = 0;
        let mut plain_from = 0;
        while i < frames.len() {
            let run = if gso_max > 1 { gso_run(&frames[i..], gso_max) } else { 1 };
            if run < 2 {
                i += 1;
                continue;
            }
            // Frames before the run go first, as they are.
            if plain_from < i {
                let n = self.send_plain(&frames[plain_from..i])?;
                sent += n;
                if n < i - plain_from {
                    return Ok(sent);
                }
            }
            if !self.send_gso(&frames[i..i + run])? {
                return Ok(sent);
            }
            sent += run;
            i += run;
            plain_from = i;
        }
        if plain_from < frames.len() {
            sent += self.send_plain(&frames[plain_from..])?;
        }
        Ok(sent)
    }

    /// Frames of one size to one peer, laid end to end, as one send the kernel cuts up.
    /// False when the socket buffer is full.
    fn send_gso(&self, run: &[OutFrame<'_>]) -> io::Result<bool> {
        let mut buf = self.gso_buf.lock().unwrap_or_else(|e| e.into_inner());
        buf.clear();
        for f in run {
            buf.extend_from_slice(f.head);
            buf.extend_from_slice(f.body);
        }
        self.send_segments(&buf, run[0].len(), run[0].to)
    }

    /// Frames of `size` bytes (the last may be shorter) laid end to end in `contents`, to
    /// `to`, as one send the kernel cuts up. False when the socket buffer is full.
    fn send_segments(&self, contents: &[u8], size: usize, to: SocketAddr) -> io::Result<bool> {
        let t = Transmit { destination: to, ecn: None, contents, segment_size: Some(size), src_ip: None };
        match self.state.try_send(UdpSockRef::from(&self.sock), &t) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => Ok(false),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOBUFS.raw_os_error()) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Frames laid end to end in `buf`, of the lengths `lens` in order, all to `to`: as
    /// [`LinkSocket::send_batch`], but a run of equal lengths goes as one segmentation-offload
    /// send straight from `buf`, without first being gathered into a buffer of its own (a
    /// sealed connection's frames lie whole, one after another, in the buffer they were
    /// gathered in). Returns how many went out.
    pub fn send_laid(&self, buf: &[u8], lens: &[usize], to: SocketAddr) -> io::Result<usize> {
        let total: usize = lens.iter().sum();
        if total > buf.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "frames longer than their buffer"));
        }
        let gso_max = self.gso_segments_max();
        let (mut sent, mut at, mut i) = (0, 0, 0);
        // Frames outside runs, gathered for one `sendmmsg`.
        let mut plain: Vec<OutFrame<'_>> = Vec::new();
        while i < lens.len() {
            let run = if gso_max > 1 { run_of(lens.len() - i, |k| Some(lens[i + k]), gso_max) } else { 1 };
            let bytes: usize = lens[i..i + run].iter().sum();
            if run < 2 {
                plain.push(OutFrame { head: &buf[at..at + bytes], body: &[], to });
            } else {
                if !plain.is_empty() {
                    let n = self.send_plain(&plain)?;
                    sent += n;
                    if n < plain.len() {
                        return Ok(sent);
                    }
                    plain.clear();
                }
                if !self.send_segments(&buf[at..at + bytes], lens[i], to)? {
                    return Ok(sent);
                }
                sent += run;
            }
            i += run;
            at += bytes;
        }
        if !plain.is_empty() {
            sent += self.send_plain(&plain)?;
        }
        Ok(sent)
    }

    /// Frames with `sendmmsg`, each in two parts.
    fn send_plain(&self, frames: &[OutFrame<'_>]) -> io::Result<usize> {
        if let [f] = frames {
            // One frame (the latency case): one `sendmsg`, nothing allocated.
            let iov = [IoSlice::new(f.head), IoSlice::new(f.body)];
            let parts = if f.body.is_empty() { &iov[..1] } else { &iov[..] };
            let to = SocketAddrAny::from(f.to);
            let mut control = Default::default();
            return match rustix::net::sendmsg_addr(&self.sock, &to, parts, &mut control, SendFlags::empty()) {
                Ok(_) => Ok(1),
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::NOBUFS | rustix::io::Errno::INTR) => Ok(0),
                Err(e) => Err(e.into()),
            };
        }
        let mut sent = 0;
        for chunk in frames.chunks(SEND_BATCH_MAX) {
            let addrs: Vec<SocketAddrAny> = chunk.iter().map(|f| SocketAddrAny::from(f.to)).collect();
            let iovs: Vec<[IoSlice<'_>; 2]> =
                chunk.iter().map(|f| [IoSlice::new(f.head), IoSlice::new(f.body)]).collect();
            let mut controls: Vec<rustix::net::SendAncillaryBuffer<'_, '_, '_>> =
                (0..chunk.len()).map(|_| Default::default()).collect();
            let mut msgs: Vec<MMsgHdr<'_>> = iovs
                .iter()
                .zip(&addrs)
                .zip(controls.iter_mut())
                .zip(chunk)
                .map(|(((iov, addr), control), f)| {
                    // An empty body adds nothing to the datagram; leave it out of the vector.
                    let parts = if f.body.is_empty() { &iov[..1] } else { &iov[..] };
                    MMsgHdr::new_with_addr(addr, parts, control)
                })
                .collect();
            match rustix::net::sendmmsg(&self.sock, &mut msgs, SendFlags::empty()) {
                Ok(n) => {
                    sent += n;
                    if n < chunk.len() {
                        return Ok(sent);
                    }
                }
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::NOBUFS) => return Ok(sent),
                Err(rustix::io::Errno::INTR) => return Ok(sent),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(sent)
    }

    /// Receive the datagrams waiting, up to [`RECV_BATCH`] of them, and hand each to `each`
    /// with its sender. Returns how many there were (0: none waiting). `each` breaks to have
    /// what it got acted on first: no more are taken from the socket after that one (though a
    /// receive that got several at once still hands them all over), and the buffers do not
    /// read as drained.
    pub fn recv_batch(
        &self,
        bufs: &mut RecvBufs,
        mut each: impl FnMut(&[u8], SocketAddr) -> ControlFlow<()>,
    ) -> io::Result<usize> {
        if let Some(gro) = &self.gro {
            return self.recv_coalesced(gro, bufs, each);
        }
        bufs.drained = true;
        let buf = &mut bufs.buf[..];
        for n in 0..RECV_BATCH {
            // Straight to the system call (the C library's wrapper adds cancellation bookkeeping
            // to every look, most of which find nothing).
            match rustix::net::recvfrom(&self.sock, &mut *buf, RecvFlags::DONTWAIT) {
                Ok((_, len, Some(from))) => match SocketAddr::try_from(from) {
                    Ok(from) => {
                        if each(&buf[..len.min(buf.len())], from).is_break() {
                            bufs.drained = false;
                            return Ok(n + 1);
                        }
                    }
                    Err(_) => continue,
                },
                Ok((_, _, None)) => continue,
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::CONNREFUSED) => return Ok(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        bufs.drained = false;
        Ok(RECV_BATCH)
    }
}

impl LinkSocket {
    /// Several buffers in one `recvmmsg`, each possibly holding a run of frames the kernel
    /// coalesced (`stride` bytes apart).
    fn recv_coalesced(
        &self,
        gro: &UdpSocketState,
        bufs: &mut RecvBufs,
        mut each: impl FnMut(&[u8], SocketAddr) -> ControlFlow<()>,
    ) -> io::Result<usize> {
        if bufs.gro.is_empty() {
            bufs.gro = (0..GRO_BATCH).map(|_| vec![0u8; GRO_BUFFER_BYTES]).collect();
            bufs.meta = vec![RecvMeta::default(); GRO_BATCH];
        }
        bufs.drained = true;
        // On the stack: a receive per arriving frame allocates nothing.
        let mut gro_bufs = bufs.gro.iter_mut();
        let mut slices: [IoSliceMut<'_>; GRO_BATCH] =
            std::array::from_fn(|_| IoSliceMut::new(gro_bufs.next().expect("GRO_BATCH buffers")));
        let n = match gro.recv(UdpSockRef::from(&self.sock), &mut slices, &mut bufs.meta) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::ConnectionRefused => {
                return Ok(0)
            }
            Err(e) => return Err(e),
        };
        bufs.drained = n < GRO_BATCH;
        let mut count = 0;
        for (m, buf) in bufs.meta.iter().zip(slices.iter()).take(n) {
            let data = &buf[..m.len.min(buf.len())];
            let stride = if m.stride == 0 { data.len().max(1) } else { m.stride };
            for d in data.chunks(stride) {
                // Already out of the socket: every one is handed over.
                let _ = each(d, m.addr);
                count += 1;
            }
        }
        Ok(count)
    }
}

impl AsFd for LinkSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A link that keeps what it is asked to send.
    #[derive(Default)]
    struct Kept(Vec<Vec<u8>>);

    impl SendLink for &mut Kept {
        fn send_batch(&mut self, frames: &[OutFrame<'_>]) -> io::Result<usize> {
            self.0.extend(frames.iter().map(|f| [f.head, f.body].concat()));
            Ok(frames.len())
        }
    }

    // Checks the fault wrapper around a link: with every frame duplicated, the link underneath
    // is handed each frame (head and body joined) twice, in order; with every frame dropped it
    // is handed none; either way the caller is told all its frames went.
    #[test]
    fn faults_wrap_a_link() {
        let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let frames = [OutFrame { head: b"ab", body: b"cd", to }, OutFrame { head: b"ef", body: &[], to }];
        let spec = |dup: f64, drop: f64| FaultSpec { drop, dup, reorder: 0.0, corrupt: 0.0, seed: 1, down: None };
        let mut kept = Kept::default();
        let mut fi = FaultInjector::new(spec(1.0, 0.0), 0);
        assert_eq!(Faulty { inner: &mut kept, faults: &mut fi }.send_batch(&frames).unwrap(), 2);
        assert_eq!(kept.0, vec![b"abcd".to_vec(), b"abcd".to_vec(), b"ef".to_vec(), b"ef".to_vec()]);
        let mut kept = Kept::default();
        let mut fi = FaultInjector::new(spec(0.0, 1.0), 0);
        assert_eq!(Faulty { inner: &mut kept, faults: &mut fi }.send_batch(&frames).unwrap(), 2);
        assert!(kept.0.is_empty());
    }

    /// A link that hands over the frames it was given.
    struct Given(Vec<Vec<u8>>);

    impl RecvLink for Given {
        fn recv_batch<F: FnMut(&[u8], SocketAddr) -> ControlFlow<()>>(
            &mut self,
            _bufs: &mut RecvBufs,
            mut each: F,
        ) -> io::Result<usize> {
            let n = self.0.len();
            for f in self.0.drain(..) {
                let _ = each(&f, "127.0.0.1:9".parse().unwrap());
            }
            Ok(n)
        }
    }

    // Checks the fault wrapper on the receiving side: with every frame duplicated, each frame
    // taken from the link is handed over twice, in order; with every frame dropped, none is,
    // though the link still counts what it took.
    #[test]
    fn faults_wrap_a_receiving_link() {
        let spec = |dup: f64, drop: f64| FaultSpec { drop, dup, reorder: 0.0, corrupt: 0.0, seed: 1, down: None };
        let mut bufs = RecvBufs::default();
        for (dup, drop, want) in
            [(1.0, 0.0, vec![b"ab".to_vec(), b"ab".to_vec(), b"c".to_vec(), b"c".to_vec()]), (0.0, 1.0, vec![])]
        {
            let mut fi = FaultInjector::new(spec(dup, drop), 0);
            let mut link = Faulty { inner: Given(vec![b"ab".to_vec(), b"c".to_vec()]), faults: &mut fi };
            let mut got = Vec::new();
            let n = link
                .recv_batch(&mut bufs, |f, _| {
                    got.push(f.to_vec());
                    ControlFlow::Continue(())
                })
                .unwrap();
            assert_eq!((n, got), (2, want));
        }
    }

    // Checks batched sending and draining receives on loopback, with coalescing receives (small
    // frames) and plain ones (jumbo links): every frame of a batch, whole or sent in two parts,
    // arrives intact as one datagram, from the sender's address, and an empty socket answers 0 and reads as drained.
    #[test]
    fn batch_over_loopback() {
        // Both receive paths: coalescing (small frames) and plain (jumbo links).
        for mtu in [1500, 65_000] {
            batch_over_loopback_at(mtu);
        }
    }

    fn batch_over_loopback_at(mtu: usize) {
        let a = LinkSocket::bind("127.0.0.1:0", mtu).unwrap();
        let b = LinkSocket::bind("127.0.0.1:0", mtu).unwrap();
        // Every other frame goes in two parts, split at a different place each time.
        let frames: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; 100 + i as usize]).collect();
        let list: Vec<OutFrame<'_>> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let cut = if i % 2 == 0 { f.len() } else { i };
                OutFrame { head: &f[..cut], body: &f[cut..], to: b.local_addr() }
            })
            .collect();
        assert_eq!(a.send_batch(&list).unwrap(), 100);
        let waker = Waker::new().unwrap();
        let mut got = Vec::new();
        let mut bufs = RecvBufs::default();
        while got.len() < 100 {
            let n = b
                .recv_batch(&mut bufs, |d, from| {
                    assert_eq!(from, a.local_addr());
                    got.push(d.to_vec());
                    ControlFlow::Continue(())
                })
                .unwrap();
            if n == 0 {
                wait(std::slice::from_ref(&b), &waker, Some(Duration::from_secs(5)));
            }
        }
        assert_eq!(got, frames);
        assert_eq!(b.recv_batch(&mut bufs, |_, _| ControlFlow::Continue(())).unwrap(), 0);
        assert!(bufs.drained(), "an empty socket reads as drained");
    }

    // Checks that a receiver can have a frame acted on before more are taken: on a jumbo link
    // (one datagram per look), breaking on the first of three takes only it and leaves the
    // buffers not drained; the next look takes the other two, in order, and finds the socket
    // empty.
    #[test]
    fn a_break_stops_taking_frames() {
        let a = LinkSocket::bind("127.0.0.1:0", 65_000).unwrap();
        let b = LinkSocket::bind("127.0.0.1:0", 65_000).unwrap();
        let frames: Vec<Vec<u8>> = (1..=3u8).map(|i| vec![i; 200]).collect();
        let list: Vec<OutFrame<'_>> =
            frames.iter().map(|f| OutFrame { head: f, body: &[], to: b.local_addr() }).collect();
        assert_eq!(a.send_batch(&list).unwrap(), 3);
        let waker = Waker::new().unwrap();
        wait(std::slice::from_ref(&b), &waker, Some(Duration::from_secs(5)));
        let mut bufs = RecvBufs::default();
        let mut got = Vec::new();
        let n = b
            .recv_batch(&mut bufs, |d, _| {
                got.push(d.to_vec());
                ControlFlow::Break(())
            })
            .unwrap();
        assert_eq!((n, &got[..]), (1, &frames[..1]));
        assert!(!bufs.drained(), "a break says nothing of what is left");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.len() < 3 && std::time::Instant::now() < deadline {
            b.recv_batch(&mut bufs, |d, _| {
                got.push(d.to_vec());
                ControlFlow::Continue(())
            })
            .unwrap();
        }
        assert_eq!(got, frames);
        assert!(bufs.drained());
    }

    // Checks the segmentation-offload path end to end: a run of equal frames (then a shorter
    // one, then frames to another address) sent in one batch arrives as separate datagrams,
    // each intact and in order, however the kernel cut or coalesced them on the way.
    #[test]
    fn equal_frames_go_as_one_offloaded_send() {
        let a = LinkSocket::bind("127.0.0.1:0", 1500).unwrap();
        let b = LinkSocket::bind("127.0.0.1:0", 1500).unwrap();
        let c = LinkSocket::bind("127.0.0.1:0", 1500).unwrap();
        let mut frames: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 1200]).collect();
        frames.push(vec![99; 300]);
        let list: Vec<OutFrame<'_>> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| OutFrame {
                head: &f[..32],
                body: &f[32..],
                to: if i < 38 { b.local_addr() } else { c.local_addr() },
            })
            .collect();
        assert_eq!(gso_run(&list, 64), 38, "a run stops where the peer changes");
        assert_eq!(gso_run(&list[38..], 64), 3, "a shorter frame ends a run, itself included");
        assert_eq!(a.send_batch(&list).unwrap(), 41);
        for (sock, want) in [(&b, &frames[..38]), (&c, &frames[38..])] {
            assert_eq!(receive(sock, want.len()), want);
        }
    }

    /// Up to `count` datagrams from `sock`, in the order taken, waiting at most 5 s for them.
    fn receive(sock: &LinkSocket, count: usize) -> Vec<Vec<u8>> {
        let waker = Waker::new().unwrap();
        let mut bufs = RecvBufs::default();
        let mut got = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while got.len() < count && std::time::Instant::now() < deadline {
            let keep = |d: &[u8], _| {
                got.push(d.to_vec());
                ControlFlow::Continue(())
            };
            if sock.recv_batch(&mut bufs, keep).unwrap() == 0 {
                wait(std::slice::from_ref(sock), &waker, Some(Duration::from_millis(100)));
            }
        }
        got
    }

    // Checks frames sent straight from the buffer they lie in (`send_laid`): runs of equal
    // frames, shorter frames between them and a lone large one, laid end to end in one buffer,
    // arrive as separate datagrams, each intact and in order; lengths longer than the buffer are
    // refused with a clear error, nothing sent.
    #[test]
    fn frames_laid_end_to_end_go_from_where_they_lie() {
        let a = LinkSocket::bind("127.0.0.1:0", 9000).unwrap();
        let b = LinkSocket::bind("127.0.0.1:0", 9000).unwrap();
        let lens: Vec<usize> = [vec![8972; 9], vec![100, 8972, 8972, 4000], vec![1200; 30], vec![8972]].concat();
        let frames: Vec<Vec<u8>> = lens.iter().enumerate().map(|(i, &l)| vec![i as u8; l]).collect();
        let buf = frames.concat();
        assert_eq!(a.send_laid(&buf, &lens, b.local_addr()).unwrap(), lens.len());
        assert_eq!(receive(&b, frames.len()), frames);
        let e = a.send_laid(&buf[..100], &lens, b.local_addr()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    // Checks that a MTU outside what UDP can carry is refused with a clear error.
    #[test]
    fn bad_mtu_is_refused() {
        assert!(LinkSocket::bind("127.0.0.1:0", 70_000).is_err());
    }
}
