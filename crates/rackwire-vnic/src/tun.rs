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
/// `IFF_VNET_HDR`: each packet is preceded by a `virtio_net_hdr` (checksum and segmentation
/// offload state).
const IFF_VNET_HDR: libc::c_short = 0x4000;
/// `TUNSETOFFLOAD`: `_IOW('T', 208, unsigned int)`.
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
/// Offloads: checksum, TCP segmentation for IPv4 and IPv6, UDP segmentation for IPv4 and
/// IPv6 (Linux 6.2 on).
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_USO4: libc::c_uint = 0x20;
const TUN_F_USO6: libc::c_uint = 0x40;

/// Bytes of the `virtio_net_hdr` before every packet read from or written to the device.
pub const VNET_HDR_LEN: usize = 10;

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
        let mut req = IfReq { name: [0; 16], flags: IFF_TUN | IFF_NO_PI | IFF_VNET_HDR, _pad: [0; 22] };
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
        rustix::fs::fcntl_setfl(&fd, OFlags::NONBLOCK)?;
        let tun = Tun { fd, name: name.into() };
        tun.set_offload(true)?;
        Ok(tun)
    }

    /// Let the kernel hand over packets with their checksums not yet computed and, with `tso`,
    /// TCP segments not yet cut and a program's UDP datagrams sent with segmentation offload
    /// (`UDP_SEGMENT`, as QUIC stacks send) not yet cut (up to the device's GSO size): the
    /// peer's kernel finishes them or, delivering locally, never needs to. The
    /// `virtio_net_hdr` in front of each packet says what is left to do; it travels with the
    /// packet. A kernel without UDP segmentation on TUN devices gets TCP's alone.
    pub fn set_offload(&self, tso: bool) -> io::Result<()> {
        if !tso {
            return self.offload(TUN_F_CSUM);
        }
        let tcp = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
        self.offload(tcp | TUN_F_USO4 | TUN_F_USO6).or_else(|_| self.offload(tcp))
    }

    fn offload(&self, flags: libc::c_uint) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: TUNSETOFFLOAD takes its argument by value (an unsigned int of flags); the
        // descriptor is ours and open.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), TUNSETOFFLOAD as _, flags as libc::c_ulong) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Read one packet, waiting at most `timeout`. `Ok(0)`: none arrived in time.
    ///
    /// A packet already queued is taken at once; only an empty queue costs a wait in `poll`
    /// (under load, one system call a packet instead of two).
    pub fn read_timeout(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        self.read_timeout_then(buf, timeout, || {})
    }

    /// [`Tun::read_timeout`], calling `before_wait` when the queue is empty, before waiting.
    pub fn read_timeout_then(
        &self,
        buf: &mut [u8],
        timeout: Duration,
        before_wait: impl FnOnce(),
    ) -> io::Result<usize> {
        let n = self.try_read(buf)?;
        if n > 0 {
            return Ok(n);
        }
        before_wait();
        let ts = rustix::time::Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: timeout.subsec_nanos() as _ };
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => return Ok(0),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        self.try_read(buf)
    }

    /// Read one packet if one is queued; `Ok(0)` if none is.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
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

    /// Write one packet given in parts (its headers from one place, its payload from
    /// another), in one system call.
    pub fn write_parts(&self, parts: &[&[u8]]) -> io::Result<()> {
        let iov: Vec<io::IoSlice<'_>> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
        rustix::io::writev(&self.fd, &iov)?;
        Ok(())
    }
}

impl AsFd for Tun {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
