//! Control sockets between hosts that share memory: Unix `SOCK_SEQPACKET` with descriptor
//! passing. One packet is one control message, so no framing is needed, and descriptors travel
//! attached to the message that explains them.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags, Shutdown, SocketAddrUnix, SocketFlags, SocketType,
};

/// The largest control message, in bytes.
pub const CONTROL_MSG_BYTES_MAX: usize = 64 * 1024;
/// The most descriptors one control message may carry.
pub const CONTROL_FDS_MAX: usize = 4;
/// The longest a control message waits for room in the peer's socket (a Unix datagram
/// socket queues only a few messages for its reader): a peer that reads none for this long
/// makes the send fail (`ErrorKind::TimedOut`), and its owner cuts it off, so no peer holds a
/// sender (and whatever it holds, such as a region's lock) for longer.
pub const CONTROL_SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// Pending connections a listening endpoint queues.
const LISTEN_BACKLOG: i32 = 64;

fn io(e: rustix::io::Errno) -> std::io::Error {
    e.into()
}

fn seqpacket() -> std::io::Result<OwnedFd> {
    rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).map_err(io)
}

/// A listening control socket bound to a path. The path is removed on drop.
#[derive(Debug)]
pub struct Endpoint {
    fd: OwnedFd,
    path: PathBuf,
    wake: OwnedFd,
}

impl Endpoint {
    /// Bind and listen at `path`, replacing a stale socket file left there.
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        let fd = seqpacket()?;
        let _ = std::fs::remove_file(path);
        let addr = SocketAddrUnix::new(path).map_err(io)?;
        rustix::net::bind(&fd, &addr).map_err(io)?;
        rustix::net::listen(&fd, LISTEN_BACKLOG).map_err(io)?;
        let wake = rustix::event::eventfd(0, EventfdFlags::CLOEXEC).map_err(io)?;
        Ok(Endpoint { fd, path: path.to_owned(), wake })
    }

    /// The path peers connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Wait for the next connection. Returns `Ok(None)` once [`Endpoint::stop`] was called.
    pub fn accept(&self) -> std::io::Result<Option<ControlSocket>> {
        loop {
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN), PollFd::new(&self.wake, PollFlags::IN)];
            match rustix::event::poll(&mut fds, None) {
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io(e)),
                Ok(_) => {}
            }
            if !fds[1].revents().is_empty() {
                return Ok(None);
            }
            match rustix::net::accept_with(&self.fd, SocketFlags::CLOEXEC) {
                Ok(fd) => return Ok(Some(ControlSocket { fd })),
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => continue,
                Err(e) => return Err(io(e)),
            }
        }
    }

    /// Make a pending and every later [`Endpoint::accept`] return `Ok(None)`.
    pub fn stop(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One end of a connected control socket.
#[derive(Debug)]
pub struct ControlSocket {
    fd: OwnedFd,
}

impl ControlSocket {
    /// Connect to the endpoint bound at `path`.
    pub fn connect(path: &Path) -> std::io::Result<Self> {
        let fd = seqpacket()?;
        let addr = SocketAddrUnix::new(path).map_err(io)?;
        rustix::net::connect(&fd, &addr).map_err(io)?;
        Ok(ControlSocket { fd })
    }

    /// A connected pair, for tests and for in-process peers.
    pub fn pair() -> std::io::Result<(Self, Self)> {
        let (a, b) = rustix::net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
            .map_err(io)?;
        Ok((ControlSocket { fd: a }, ControlSocket { fd: b }))
    }

    /// Send one message with up to [`CONTROL_FDS_MAX`] descriptors attached, waiting at most
    /// [`CONTROL_SEND_TIMEOUT`] for room in the peer's socket.
    pub fn send(&self, data: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        self.send_within(data, fds, CONTROL_SEND_TIMEOUT)
    }

    /// [`ControlSocket::send`], waiting at most `timeout` for room: a peer that does not read
    /// its socket makes the send fail (`ErrorKind::TimedOut`) then, instead of holding the
    /// sender for as long as it likes.
    pub fn send_within(&self, data: &[u8], fds: &[BorrowedFd<'_>], timeout: Duration) -> std::io::Result<()> {
        if data.len() > CONTROL_MSG_BYTES_MAX || fds.len() > CONTROL_FDS_MAX || data.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "control message size or descriptor count out of range",
            ));
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(CONTROL_FDS_MAX))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(std::io::Error::other("descriptors do not fit the control buffer"));
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let flags = SendFlags::NOSIGNAL | SendFlags::DONTWAIT;
            match rustix::net::sendmsg(&self.fd, &[IoSlice::new(data)], &mut control, flags) {
                Ok(n) if n == data.len() => return Ok(()),
                Ok(_) => return Err(std::io::Error::other("control message sent in part")),
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => {
                    // The peer's queue is full: wait for it to read, until the deadline.
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the peer reads no control messages",
                        ));
                    }
                    let ts =
                        rustix::time::Timespec { tv_sec: left.as_secs() as i64, tv_nsec: left.subsec_nanos() as _ };
                    let mut pfd = [PollFd::new(&self.fd, PollFlags::OUT)];
                    let _ = rustix::event::poll(&mut pfd, Some(&ts));
                }
                Err(e) => return Err(io(e)),
            }
        }
    }

    /// Receive one message into `buf` and the descriptors attached to it. `Ok(0)` bytes means
    /// the peer closed. A message longer than `buf` is an error, not a silent truncation.
    pub fn recv(&self, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(CONTROL_FDS_MAX))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = loop {
            let mut iov = [IoSliceMut::new(buf)];
            match rustix::net::recvmsg(&self.fd, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
                Ok(r) => break r,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io(e)),
            }
        };
        let mut fds = Vec::new();
        for msg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(it) = msg {
                fds.extend(it);
            }
        }
        if got.flags.contains(rustix::net::ReturnFlags::TRUNC) || got.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "control message truncated"));
        }
        Ok((got.bytes, fds))
    }

    /// Bound how long [`ControlSocket::recv`] blocks (`None`: for ever).
    pub fn set_recv_timeout(&self, t: Option<Duration>) -> std::io::Result<()> {
        rustix::net::sockopt::set_socket_timeout(&self.fd, rustix::net::sockopt::Timeout::Recv, t).map_err(io)
    }

    /// Shut both directions: the peer's and our own pending `recv` return end-of-stream.
    pub fn shutdown(&self) {
        let _ = rustix::net::shutdown(&self.fd, Shutdown::Both);
    }

    /// The process id of the peer, as the kernel saw it at connect time.
    pub fn peer_pid(&self) -> Option<i32> {
        rustix::net::sockopt::socket_peercred(&self.fd).ok().map(|c| c.pid.as_raw_nonzero().get())
    }
}

impl AsFd for ControlSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MapAccess, SharedMem};

    // Checks that a descriptor passed over the socket maps to the same memory on the other
    // side (a byte written by the sender is read by the receiver through its own mapping).
    #[test]
    fn passes_memfd_descriptor() {
        let (a, b) = ControlSocket::pair().unwrap();
        let mem = SharedMem::create("x", 4096).unwrap();
        assert!(mem.write_at(7, b"z"));
        a.send(b"region", &[mem.fd()]).unwrap();
        let mut buf = [0u8; 64];
        let (n, mut fds) = b.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"region");
        assert_eq!(fds.len(), 1);
        let peer = SharedMem::from_fd(fds.pop().unwrap(), MapAccess::ReadWrite).unwrap();
        let mut one = [0u8];
        assert!(peer.read_at(7, &mut one));
        assert_eq!(&one, b"z");
    }

    // Checks that a message longer than the receive buffer is reported, not cut silently.
    #[test]
    fn oversize_message_is_an_error() {
        let (a, b) = ControlSocket::pair().unwrap();
        a.send(&[1u8; 100], &[]).unwrap();
        let mut small = [0u8; 10];
        assert!(b.recv(&mut small).is_err());
    }

    // Checks that stop() wakes a blocked accept, which then reports no connection.
    // Checks that a peer that never reads cannot hold a sender for long: sends into its socket
    // fill it (a few messages), and the next one fails after the given wait (TimedOut), not
    // later (bounded by a count and a time); once the peer reads one message, sending works.
    #[test]
    fn a_peer_that_does_not_read_holds_a_sender_only_so_long() {
        let (a, b) = ControlSocket::pair().unwrap();
        let wait = Duration::from_millis(100);
        let mut sent = 0;
        let t0 = std::time::Instant::now();
        let err = loop {
            match a.send_within(&[7u8; 512], &[], wait) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 1_000_000, "the socket never filled");
        };
        let took = t0.elapsed();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(sent > 0 && took >= wait && took < wait * 20, "{sent} sent, gave up after {took:?}");
        let mut buf = [0u8; 1024];
        assert_eq!(b.recv(&mut buf).unwrap().0, 512);
        a.send_within(&[8u8; 512], &[], wait).unwrap();
    }

    #[test]
    fn stop_wakes_accept() {
        let dir = std::env::temp_dir().join(format!("rw-ep-{}", std::process::id()));
        let ep = std::sync::Arc::new(Endpoint::bind(&dir).unwrap());
        let ep2 = ep.clone();
        let t = std::thread::spawn(move || ep2.accept().unwrap().is_none());
        std::thread::sleep(Duration::from_millis(20));
        ep.stop();
        assert!(t.join().unwrap());
    }
}
