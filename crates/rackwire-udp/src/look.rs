//! A quick look at what waits on the links, the waker and one descriptor of the caller's, for
//! a thread that looks again and again (the network thread between two rounds while it spins).
//!
//! [`crate::wait_with`] with a zero timeout asks each descriptor in turn (`ppoll`: every one
//! fetched, asked and put back, each look); here they sit in one epoll set, whose ready list
//! the kernel keeps as packets arrive, so a look with nothing waiting reads an empty list. On
//! this kind of machine, with five descriptors: about 175 ns a look against about 300.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::epoll;

use crate::wait::{Ready, Waker};
use crate::LinkSocket;

/// The waker's tag in the set (links are tagged with their index).
const WAKER: u64 = u64::MAX;
/// The caller's descriptor's tag.
const ALSO: u64 = u64::MAX - 1;
/// Events one look takes: every link, the waker and the caller's descriptor, if each were
/// ready at once, up to the most links a connection uses (more links still show, over looks).
const EVENTS_MAX: usize = 16;

/// The links, the waker and (while [`Looker::watch`] says so) one descriptor of the caller's,
/// in one epoll set (see the module documentation).
#[derive(Debug)]
pub struct Looker {
    set: OwnedFd,
}

impl Looker {
    /// A set of `socks` (link `i` tagged `i`) and `waker`.
    pub fn new(socks: &[LinkSocket], waker: &Waker) -> io::Result<Looker> {
        let set = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        for (i, s) in socks.iter().enumerate() {
            epoll::add(&set, s, epoll::EventData::new_u64(i as u64), epoll::EventFlags::IN)?;
        }
        epoll::add(&set, waker.fd(), epoll::EventData::new_u64(WAKER), epoll::EventFlags::IN)?;
        Ok(Looker { set })
    }

    /// Look at `fd` too, until [`Looker::unwatch`]: it must stay open until then.
    pub fn watch(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        Ok(epoll::add(&self.set, fd, epoll::EventData::new_u64(ALSO), epoll::EventFlags::IN)?)
    }

    /// Stop looking at `fd` (given to [`Looker::watch`] before).
    pub fn unwatch(&self, fd: BorrowedFd<'_>) {
        let _ = epoll::delete(&self.set, fd);
    }

    /// What waits now, without waiting, as [`crate::wait_with`] with a zero timeout tells it
    /// (a woken waker is consumed, and sets every link's bit).
    pub fn look(&self, waker: &Waker) -> Ready {
        let mut events = [std::mem::MaybeUninit::uninit(); EVENTS_MAX];
        let zero = rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 };
        let Ok((got, _)) = epoll::wait(&self.set, &mut events[..], Some(&zero)) else {
            return Ready::default();
        };
        let mut ready = Ready::default();
        for e in got.iter() {
            match e.data.u64() {
                WAKER => {
                    waker.drain();
                    ready.readable = u64::MAX;
                }
                ALSO => ready.also = true,
                i if i < 64 => ready.readable |= 1 << i,
                _ => ready.readable = u64::MAX,
            }
        }
        ready.links = ready.readable != 0;
        ready
    }
}

impl AsFd for Looker {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.set.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::AsFd;

    use super::*;
    use crate::OutFrame;

    // Checks that a look tells what `wait_with` tells, with two links, the waker and a socket
    // pair standing in for the caller's descriptor: nothing at first; the second link's bit
    // alone once a datagram waits there (and still on the next look: it is not consumed);
    // the caller's descriptor apart from the links while watched, and not after `unwatch`;
    // every bit after a wake, which the look consumes.
    #[test]
    fn a_look_tells_what_waits_where() {
        let a = LinkSocket::bind("127.0.0.1:0", 1500).unwrap();
        let b = LinkSocket::bind("127.0.0.1:0", 1500).unwrap();
        let waker = Waker::new().unwrap();
        let to_b = b.local_addr();
        let socks = [a, b];
        let looker = Looker::new(&socks, &waker).unwrap();
        assert_eq!(looker.look(&waker), Ready::default());
        assert_eq!(socks[0].send_batch(&[OutFrame { head: b"x", body: &[], to: to_b }]).unwrap(), 1);
        assert!(crate::wait(&socks, &waker, Some(std::time::Duration::from_secs(5))));
        assert_eq!(looker.look(&waker), Ready { links: true, also: false, readable: 0b10 });
        assert_eq!(looker.look(&waker).readable, 0b10, "still there");
        let (mut w, r) = std::os::unix::net::UnixStream::pair().unwrap();
        looker.watch(r.as_fd()).unwrap();
        w.write_all(b"p").unwrap();
        assert_eq!(looker.look(&waker), Ready { links: true, also: true, readable: 0b10 });
        looker.unwatch(r.as_fd());
        assert!(!looker.look(&waker).also, "no longer watched");
        waker.wake();
        assert_eq!(looker.look(&waker).readable, u64::MAX);
        assert_eq!(looker.look(&waker).readable, 0b10, "the wake was consumed");
    }
}
