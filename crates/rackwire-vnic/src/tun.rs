//! The TUN device: IP packets in and out of the kernel as plain reads and writes.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::{PollFd, PollFlags};
use rustix::fs::{Mode, OFlags};

/// Longest interface name the kernel takes (`IFNAMSIZ` less the terminating zero).
pub const IFNAME_MAX: usize = 15;

/// `TUNSETIFF`: `_IOW('T', 202, int)`.
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
/// `IFF_TUN`: IP packets, no Ethernet header.
const IFF_TUN: libc::c_short = 0x0001;
/// `IFF_NO_PI`: no packet-information prefix.
const IFF_NO_PI: libc::c_short = 0x1000;

/// `struct ifreq` as `TUNSETIFF` reads it: the name, then the flags (the rest of the union is
/// padding here).
#[repr(C)]
struct IfReq {
    name: [libc::c_char; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// An open TUN device. It exists while this is open: dropping it removes the interface, and
/// with it every route through it.
#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
}

impl Tun {
    /// Create the TUN interface `name` (needs `CAP_NET_ADMIN`).
    pub fn create(name: &str) -> io::Result<Tun> {
        if name.is_empty() || name.len() > IFNAME_MAX || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interface name {name:?}: 1 to {IFNAME_MAX} letters, digits or '-'"),
            ));
        }
        let fd = rustix::fs::open("/dev/net/tun", OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())?;
        let mut req = IfReq { name: [0; 16], flags: IFF_TUN | IFF_NO_PI, _pad: [0; 22] };
        for (d, s) in req.name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        use std::os::fd::AsRawFd;
        // SAFETY: TUNSETIFF reads a `struct ifreq` (name and flags at the offsets of `IfReq`,
        // which is as large as the kernel's) from a pointer valid for the whole call, on a
        // descriptor we own and keep open.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Tun { fd, name: name.into() })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Read one packet, waiting at most `timeout`. `Ok(0)`: none arrived in time.
    pub fn read_timeout(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        let ts = rustix::time::Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: timeout.subsec_nanos() as _ };
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => return Ok(0),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        match rustix::io::read(&self.fd, buf) {
            Ok(n) => Ok(n),
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => Ok(0),
            Err(e) => Err(e.into()),
        }
    }

    /// Hand one packet to the kernel.
    pub fn write(&self, packet: &[u8]) -> io::Result<()> {
        rustix::io::write(&self.fd, packet)?;
        Ok(())
    }
}

impl AsFd for Tun {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
