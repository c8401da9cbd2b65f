//! UDP links for the rackwire edge transport.
//!
//! One [`LinkSocket`] per link, bound to that link's local address (each rail of a host has its
//! own address). Sends are batched with `sendmmsg`; receives drain a socket until it is empty;
//! [`wait`] blocks on several sockets and a [`Waker`] at once for the adaptive mode, while the
//! busy-poll mode simply keeps receiving. [`FaultInjector`] wraps the send path of any link with
//! seeded drop, duplication, reordering and corruption, configured from the environment or the
//! configuration file.

#![deny(unsafe_code)]

mod faults;

pub use faults::{FaultInjector, FaultSpec};

use std::io::{self, IoSlice};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::net::{MMsgHdr, SendFlags, SocketAddrAny};

/// The largest UDP payload on any link (IPv4, 64 KiB less headers).
pub const UDP_PAYLOAD_MAX: usize = 65507;
/// Frames one `sendmmsg` call carries at most.
pub const SEND_BATCH_MAX: usize = 64;
/// Socket buffer size asked for (the kernel may cap it).
pub const SOCKET_BUFFER_BYTES: usize = 8 << 20;

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

/// One link: a UDP socket bound to the link's local address.
#[derive(Debug)]
pub struct LinkSocket {
    sock: UdpSocket,
    local: SocketAddr,
    mtu: usize,
}

impl LinkSocket {
    /// Bind to `addr` (port 0 picks one). `mtu` is the largest frame this link carries.
    pub fn bind(addr: &str, mtu: usize) -> io::Result<Self> {
        if !(64..=UDP_PAYLOAD_MAX).contains(&mtu) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("link MTU {mtu} outside 64..={UDP_PAYLOAD_MAX}"),
            ));
        }
        let sock = UdpSocket::bind(addr)?;
        sock.set_nonblocking(true)?;
        // As root the limit of net.core.[rw]mem_max does not apply (the _force options).
        use rustix::net::sockopt as so;
        if so::set_socket_recv_buffer_size_force(&sock, SOCKET_BUFFER_BYTES).is_err() {
            let _ = so::set_socket_recv_buffer_size(&sock, SOCKET_BUFFER_BYTES);
        }
        if so::set_socket_send_buffer_size_force(&sock, SOCKET_BUFFER_BYTES).is_err() {
            let _ = so::set_socket_send_buffer_size(&sock, SOCKET_BUFFER_BYTES);
        }
        let local = sock.local_addr()?;
        Ok(LinkSocket { sock, local, mtu })
    }

    /// The bound address (with the port the kernel picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Largest frame.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Send frames in as few system calls as possible. Returns how many went out; a full
    /// socket buffer stops early (the protocol resends what is lost).
    pub fn send_batch(&self, frames: &[OutFrame<'_>]) -> io::Result<usize> {
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

    /// Receive one datagram if one is waiting.
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<Option<(usize, SocketAddr)>> {
        match self.sock.recv_from(buf) {
            Ok(r) => Ok(Some(r)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl AsFd for LinkSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// Wakes a thread blocked in [`wait`].
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// A new waker.
    pub fn new() -> io::Result<Self> {
        Ok(Waker { fd: rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)? })
    }
    /// Wake the waiter (coalesces).
    pub fn wake(&self) {
        let _ = rustix::io::write(&self.fd, &1u64.to_ne_bytes());
    }
    fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut b);
    }
}

/// Block until a socket is readable, the waker is woken, or `timeout` passes.
pub fn wait(socks: &[LinkSocket], waker: &Waker, timeout: Option<Duration>) {
    let mut fds: Vec<PollFd<'_>> = socks.iter().map(|s| PollFd::new(s, PollFlags::IN)).collect();
    fds.push(PollFd::new(&waker.fd, PollFlags::IN));
    let ts = timeout.map(|d| rustix::time::Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as _ });
    let _ = rustix::event::poll(&mut fds, ts.as_ref());
    waker.drain();
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks batched sending and draining receives on loopback: every frame of a batch, whole
    // or sent in two parts, arrives intact as one datagram, from the sender's address, and an
    // empty socket answers None.
    #[test]
    fn batch_over_loopback() {
        let a = LinkSocket::bind("127.0.0.1:0", 1500).unwrap();
        let b = LinkSocket::bind("127.0.0.1:0", 1500).unwrap();
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
        let mut buf = [0u8; 2048];
        while got.len() < 100 {
            match b.try_recv(&mut buf).unwrap() {
                Some((n, from)) => {
                    assert_eq!(from, a.local_addr());
                    got.push(buf[..n].to_vec());
                }
                None => wait(std::slice::from_ref(&b), &waker, Some(Duration::from_secs(5))),
            }
        }
        assert_eq!(got, frames);
        assert!(b.try_recv(&mut buf).unwrap().is_none());
    }

    // Checks that a MTU outside what UDP can carry is refused with a clear error.
    #[test]
    fn bad_mtu_is_refused() {
        assert!(LinkSocket::bind("127.0.0.1:0", 70_000).is_err());
    }
}
