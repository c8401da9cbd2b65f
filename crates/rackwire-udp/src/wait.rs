//! Waiting on several links and a waker at once (and one descriptor of the caller's).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use crate::LinkSocket;

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
    pub(crate) fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut b);
    }
}

/// Block until a socket is readable, the waker is woken, or `timeout` passes (a zero timeout
/// only looks). True when a socket is readable or the waker was woken.
pub fn wait(socks: &[LinkSocket], waker: &Waker, timeout: Option<Duration>) -> bool {
    wait_with(socks, waker, None, timeout).links
}

/// What [`wait_with`] found ready.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ready {
    /// A socket is readable, or the waker was woken.
    pub links: bool,
    /// The caller's own descriptor is readable.
    pub also: bool,
    /// The sockets found readable, one bit each (socket `i`: bit `i`; sockets past the 64th
    /// set every bit when readable); every bit when the waker was woken (whoever woke it
    /// wants every socket looked at).
    pub readable: u64,
}

/// Descriptors [`wait_with`] watches without allocating: the most links a connection uses
/// (eight), the waker and the caller's own.
const WAIT_INLINE: usize = 10;

/// [`wait`], watching one more descriptor of the caller's (readable input it takes itself),
/// whose readiness is told apart.
pub fn wait_with(
    socks: &[LinkSocket],
    waker: &Waker,
    also: Option<BorrowedFd<'_>>,
    timeout: Option<Duration>,
) -> Ready {
    // The spinning network thread looks here between every two rounds: the set is built on
    // the stack (no allocation per look) unless there are more links than usual.
    let n = socks.len() + 1 + usize::from(also.is_some());
    let own = also.unwrap_or(waker.fd.as_fd());
    let entry = |i: usize| match socks.get(i) {
        Some(s) => PollFd::new(s, PollFlags::IN),
        None if i == socks.len() => PollFd::new(&waker.fd, PollFlags::IN),
        None => PollFd::new(&own, PollFlags::IN),
    };
    let mut inline: [PollFd<'_>; WAIT_INLINE];
    let mut spilled: Vec<PollFd<'_>>;
    let fds: &mut [PollFd<'_>] = if n <= WAIT_INLINE {
        // The slots past `n` repeat the last descriptor and are not passed to the kernel.
        inline = std::array::from_fn(|i| entry(i.min(n - 1)));
        &mut inline[..n]
    } else {
        spilled = (0..n).map(entry).collect();
        &mut spilled
    };
    let ts = timeout.map(|d| rustix::time::Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as _ });
    if rustix::event::poll(fds, ts.as_ref()).unwrap_or(0) == 0 {
        return Ready::default();
    }
    let ready = |f: &PollFd<'_>| !f.revents().is_empty();
    let woken = ready(&fds[socks.len()]);
    if woken {
        waker.drain();
    }
    let bit = |i: usize| if i < 64 { 1u64 << i } else { u64::MAX };
    let readable = if woken {
        u64::MAX
    } else {
        fds[..socks.len()].iter().enumerate().filter(|(_, f)| ready(f)).fold(0, |m, (i, _)| m | bit(i))
    };
    Ready { links: readable != 0, also: also.is_some() && fds.last().is_some_and(ready), readable }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;
    use std::os::fd::AsFd;

    use super::*;
    use crate::{OutFrame, RecvBufs};

    // Checks `wait` as a look (zero timeout): false with nothing to read, true once a datagram
    // waits on the socket (which it leaves there: the next look still sees it), and true once
    // the waker was woken (which it consumes: the look after that is false again); with a
    // descriptor of the caller's watched too, its readiness is reported apart from the links';
    // and which links are readable is told link by link (all of them after a wake).
    #[test]
    fn a_zero_wait_only_looks() {
        let a = LinkSocket::bind("127.0.0.1:0", 1500).unwrap();
        let b = LinkSocket::bind("127.0.0.1:0", 1500).unwrap();
        let waker = Waker::new().unwrap();
        let socks = std::slice::from_ref(&b);
        assert!(!wait(socks, &waker, Some(Duration::ZERO)));
        let frame = [OutFrame { head: b"look", body: &[], to: b.local_addr() }];
        assert_eq!(a.send_batch(&frame).unwrap(), 1);
        // Loopback delivers at once, but give the kernel a moment on a loaded host.
        assert!(wait(socks, &waker, Some(Duration::from_secs(5))));
        assert!(wait(socks, &waker, Some(Duration::ZERO)), "the datagram is still there");
        let mut bufs = RecvBufs::default();
        assert_eq!(b.recv_batch(&mut bufs, |_, _| ControlFlow::Continue(())).unwrap(), 1);
        assert!(!wait(socks, &waker, Some(Duration::ZERO)));
        waker.wake();
        assert!(wait(&[], &waker, Some(Duration::ZERO)));
        assert!(!wait(&[], &waker, Some(Duration::ZERO)), "the wake was consumed");
        // A descriptor of the caller's is told apart from the links.
        let (mut w, r) = std::os::unix::net::UnixStream::pair().unwrap();
        let look = |fd| wait_with(socks, &waker, Some(fd), Some(Duration::ZERO));
        assert_eq!(look(r.as_fd()), Ready::default());
        std::io::Write::write_all(&mut w, b"x").unwrap();
        assert_eq!(look(r.as_fd()), Ready { links: false, also: true, readable: 0 });
        assert_eq!(a.send_batch(&frame).unwrap(), 1);
        assert!(wait(socks, &waker, Some(Duration::from_secs(5))));
        assert_eq!(look(r.as_fd()), Ready { links: true, also: true, readable: 1 });
        // Of two links, only the readable one's bit is set; a woken waker sets them all.
        let two = [a, b];
        let ready = wait_with(&two, &waker, None, Some(Duration::ZERO));
        assert_eq!(ready.readable, 0b10, "{ready:?}");
        waker.wake();
        assert_eq!(wait_with(&two, &waker, None, Some(Duration::ZERO)).readable, u64::MAX);
    }

    // Checks a look at more descriptors than fit on the stack (`WAIT_INLINE`): with a
    // datagram waiting on the last of the links, exactly that link's bit is set, and the
    // caller's descriptor (last of all) is still told apart.
    #[test]
    fn more_links_than_fit_on_the_stack_are_all_looked_at() {
        let socks: Vec<LinkSocket> = (0..WAIT_INLINE).map(|_| LinkSocket::bind("127.0.0.1:0", 1500).unwrap()).collect();
        let waker = Waker::new().unwrap();
        let last = socks.len() - 1;
        let frame = [OutFrame { head: b"far", body: &[], to: socks[last].local_addr() }];
        assert_eq!(socks[0].send_batch(&frame).unwrap(), 1);
        assert!(wait(&socks, &waker, Some(Duration::from_secs(5))));
        let ready = wait_with(&socks, &waker, None, Some(Duration::ZERO));
        assert_eq!(ready.readable, 1 << last, "{ready:?}");
        let (mut w, r) = std::os::unix::net::UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut w, b"x").unwrap();
        let ready = wait_with(&socks, &waker, Some(r.as_fd()), Some(Duration::ZERO));
        assert_eq!(ready, Ready { links: true, also: true, readable: 1 << last });
    }
}
