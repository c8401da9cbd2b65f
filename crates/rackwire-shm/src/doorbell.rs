//! Doorbells: how a sender wakes a receiver that stopped polling.
//!
//! The receiver owns a small shared page holding a `waiting` flag, and an eventfd. A receiver
//! about to sleep sets the flag, looks at its rings once more, and only then blocks on the
//! eventfd. A sender publishes its record, then rings the eventfd only if the flag is set. Both
//! sides put a sequentially consistent fence between their store and their load, so either the
//! receiver sees the record or the sender sees the flag: no wake-up is lost, and a receiver
//! that is busy polling costs senders no system call (doorbells are coalesced under load).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use crate::mem::{MapAccess, SharedMem, ShmError};

const DOORBELL_PAGE_BYTES: u64 = 4096;
/// Descriptors besides its own a doorbell's wait watches at most.
pub const WAIT_FDS_MAX: usize = 8;

/// The receiving side of a doorbell.
#[derive(Debug)]
pub struct Doorbell {
    page: SharedMem,
    efd: OwnedFd,
}

impl Doorbell {
    /// A new, disarmed doorbell.
    pub fn new() -> Result<Self, ShmError> {
        let page = SharedMem::create("rackwire-doorbell", DOORBELL_PAGE_BYTES)?;
        let efd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(ShmError::sys("eventfd"))?;
        Ok(Doorbell { page, efd })
    }

    /// The descriptors a sender needs: the flag page and the eventfd.
    pub fn fds(&self) -> [BorrowedFd<'_>; 2] {
        [self.page.fd(), self.efd.as_fd()]
    }

    /// Announce that we are about to sleep. Look at the rings once more after this.
    pub fn arm(&self) {
        self.page.atomic_u64(0).expect("flag word").store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Announce that we are polling again.
    pub fn disarm(&self) {
        self.page.atomic_u64(0).expect("flag word").store(0, Ordering::Relaxed);
    }

    /// The descriptor a ring makes readable (for an event loop that sleeps on it between
    /// [`Doorbell::arm`] and [`Doorbell::disarm`]; [`Doorbell::drain`] it after waking).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.efd.as_fd()
    }

    /// Make the descriptor readable, armed or not.
    pub fn wake(&self) {
        let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
    }

    /// Take a ring that came (the descriptor is then no longer readable).
    pub fn drain(&self) {
        let mut drain = [0u8; 8];
        let _ = rustix::io::read(&self.efd, &mut drain);
    }

    /// Ring our own doorbell (for traffic that arrives by another path, such as a network
    /// thread of this process): wakes a waiter, costs nothing when nobody waits.
    pub fn ring_local(&self) {
        fence(Ordering::SeqCst);
        if self.page.atomic_u64(0).expect("flag word").load(Ordering::Relaxed) != 0 {
            let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
        }
    }

    /// Block until rung or until `timeout` passes. Returns true when rung.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        self.wait_with(&[], timeout)
    }

    /// Block until rung, until one of `others` is readable (at most [`WAIT_FDS_MAX`] of
    /// them), or until `timeout` passes. Returns true when something woke it: a thread that
    /// serves a device and the rings sleeps on both at once.
    pub fn wait_with(&self, others: &[BorrowedFd<'_>], timeout: Option<Duration>) -> bool {
        let ts = timeout.map(|d| rustix::time::Timespec { tv_sec: d.as_secs() as i64, tv_nsec: d.subsec_nanos() as _ });
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(1 + others.len().min(WAIT_FDS_MAX));
        fds.push(PollFd::new(&self.efd, PollFlags::IN));
        fds.extend(others.iter().take(WAIT_FDS_MAX).map(|fd| PollFd::new(fd, PollFlags::IN)));
        let woke = matches!(rustix::event::poll(&mut fds, ts.as_ref()), Ok(n) if n > 0);
        if !fds[0].revents().is_empty() {
            let mut drain = [0u8; 8];
            let _ = rustix::io::read(&self.efd, &mut drain);
        }
        woke
    }
}

/// The sending side of a doorbell, made from the descriptors the receiver sent.
#[derive(Debug)]
pub struct DoorbellRemote {
    page: SharedMem,
    efd: OwnedFd,
    rings: AtomicU64,
}

impl DoorbellRemote {
    /// Attach to a receiver's doorbell.
    pub fn attach(page_fd: OwnedFd, efd: OwnedFd) -> Result<Self, ShmError> {
        let page = SharedMem::from_fd(page_fd, MapAccess::ReadWrite)?;
        if page.atomic_u64(0).is_none() {
            return Err(ShmError::BadRing("doorbell page too small"));
        }
        Ok(DoorbellRemote { page, efd, rings: AtomicU64::new(0) })
    }

    /// How many rings made a system call (the rest were coalesced away).
    pub fn rings(&self) -> u64 {
        self.rings.load(Ordering::Relaxed)
    }

    /// Wake the receiver if it is asleep. Call after publishing a record.
    #[inline]
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.page.atomic_u64(0).expect("checked at attach").load(Ordering::Relaxed) != 0 {
            self.rings.fetch_add(1, Ordering::Relaxed);
            let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks coalescing and wake-up: ringing a disarmed doorbell makes no system call
    // (counter stays 0), ringing an armed one does and wakes the waiter.
    #[test]
    fn rings_only_when_armed() {
        let bell = Doorbell::new().unwrap();
        let [p, e] = bell.fds();
        let remote = DoorbellRemote::attach(rustix::io::dup(p).unwrap(), rustix::io::dup(e).unwrap()).unwrap();
        remote.ring();
        assert_eq!(remote.rings(), 0);
        assert!(!bell.wait(Some(Duration::from_millis(1))));
        bell.arm();
        remote.ring();
        assert_eq!(remote.rings(), 1);
        assert!(bell.wait(Some(Duration::from_secs(5))));
    }

    // Checks that a wait watching another descriptor ends when that one is readable though
    // the doorbell never rang (true at once with a byte waiting in a socket pair), and that
    // with neither it times out (false after 1 ms).
    #[test]
    fn a_wait_watches_other_descriptors_too() {
        use std::io::Write;
        let bell = Doorbell::new().unwrap();
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        bell.arm();
        assert!(!bell.wait_with(&[a.as_fd()], Some(Duration::from_millis(1))));
        b.write_all(&[7]).unwrap();
        assert!(bell.wait_with(&[a.as_fd()], Some(Duration::from_secs(5))));
    }
}
