//! A bare TUN-over-UDP tunnel between two network namespaces: the limit of any virtual NIC
//! that carries a TUN device's packets between hosts as UDP datagrams (as `rw0` does across
//! racks, over the edge transport).
//!
//! One TUN device in each namespace, set up as `rw0` is, and one UDP socket beside it on the
//! host's own address; one thread per end reads a packet from its device and sends it, whole
//! (offload header and all), as one datagram to the other end's socket, and writes each
//! datagram its socket receives into its device. It waits as the edge transport's network
//! thread does: after work it looks again for [`TUNNEL_SPIN`] (yielding the core between
//! looks), then sleeps in `poll` on both descriptors. Nothing else is in between: no sealing,
//! no acknowledgements or retransmission, no fabric, no routing table, no check. What a packet
//! costs here (a TUN read, a UDP send and receive, a TUN write, and the wake-ups the spin does
//! not save) every such NIC pays too, so `rackwire bench vnic` measures it beside `rw0`'s
//! cross-rack rows to tell how much of their distance from the Ethernet path is the tunnel's
//! and how much is rackwire's.

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use crate::relay::{set_up, tun_in, Counts, Pair, Work};
use crate::{Tun, VnicError, STOP_CHECK, VNET_HDR_LEN};

/// The tunnel's interface name in both namespaces.
pub const TUNNEL_NAME: &str = "ut0";
/// The tunnel device's MTU: a packet and its offload header fit one UDP datagram (at most
/// 65507 bytes of payload over IPv4); the kernel fragments larger datagrams on the wire.
pub const TUNNEL_MTU: usize = 65_000;
const _: () = assert!(TUNNEL_MTU + VNET_HDR_LEN <= 65_507);
/// Prefix length of the tunnel's subnet: the two ends' addresses are on one link.
const TUNNEL_PREFIX: u8 = 24;
/// How long an end keeps looking after work before it sleeps: the edge transport's network
/// thread's spin, so the tunnel waits as `rw0`'s carrier does.
pub const TUNNEL_SPIN: Duration = Duration::from_micros(50);
/// Most packets an end moves one way before it looks the other way.
const TUNNEL_BURST: usize = 32;

/// One end of the tunnel: a network namespace (as `ip netns` names it), the address the
/// tunnel's device gets there, and the host's own address the datagrams leave from and
/// arrive at.
#[derive(Clone, Debug)]
pub struct TunnelEnd {
    /// Namespace name (`/run/netns/NAME`).
    pub netns: String,
    /// Address of the end's device, on a /24 shared with the other end's.
    pub addr: Ipv4Addr,
    /// The host's address on the network between the two (the tunnel's socket binds it).
    pub carrier: Ipv4Addr,
    /// Cores the end's thread runs on (empty: any; its host's, in a virtual rack whose hosts
    /// have cores of their own).
    pub cores: Vec<usize>,
}

/// A running tunnel; stopping or dropping it removes both devices.
pub struct UdpTunnel(Pair);

impl UdpTunnel {
    /// Create the tunnel's device and socket in both namespaces, address them, and start
    /// carrying packets.
    pub fn start(a: &TunnelEnd, b: &TunnelEnd) -> Result<UdpTunnel, VnicError> {
        if a.netns == b.netns {
            return Err(VnicError::Relay("both tunnel ends in one namespace".into()));
        }
        // Devices and sockets stay in the namespace they were made in: make them in a thread
        // of its own, which ends once both ends exist.
        let ends = {
            let (a, b) = (a.clone(), b.clone());
            std::thread::spawn(move || Ok::<_, VnicError>([end_in(&a)?, end_in(&b)?]))
                .join()
                .map_err(|_| VnicError::Relay("the tunnel's set-up thread panicked".into()))??
        };
        let [(ta, sa), (tb, sb)] = ends;
        let err = |e: std::io::Error| VnicError::Relay(format!("the tunnel's sockets: {e}"));
        let (addr_a, addr_b) = (sa.local_addr().map_err(err)?, sb.local_addr().map_err(err)?);
        sa.connect(addr_b).map_err(err)?;
        sb.connect(addr_a).map_err(err)?;
        set_up(&a.netns, &ta, TUNNEL_MTU, a.addr, TUNNEL_PREFIX)?;
        set_up(&b.netns, &tb, TUNNEL_MTU, b.addr, TUNNEL_PREFIX)?;
        let work =
            |tun: Tun, sock: UdpSocket| -> Work { Box::new(move |stop, counts| carry(&tun, &sock, stop, counts)) };
        let cores = [a.cores.as_slice(), b.cores.as_slice()];
        Ok(UdpTunnel(Pair::start("rw-tunnel", [work(ta, sa), work(tb, sb)], cores)?))
    }

    /// Packets each end sent into the tunnel so far, a's and b's.
    pub fn packets(&self) -> [u64; 2] {
        self.0.count(|c| &c.packets)
    }

    /// Packets or datagrams each end could not pass on (its socket or device refused them).
    pub fn dropped(&self) -> [u64; 2] {
        self.0.count(|c| &c.dropped)
    }

    /// Stop carrying; the devices go with the threads that hold them.
    pub fn stop(&mut self) {
        self.0.stop();
    }
}

/// Make one end's device and socket in its namespace (this thread moves into it).
fn end_in(end: &TunnelEnd) -> Result<(Tun, UdpSocket), VnicError> {
    // This thread is in the end's namespace from here on: the socket binds there too.
    let tun = tun_in(&end.netns, TUNNEL_NAME)?;
    let sock = UdpSocket::bind(SocketAddr::from((end.carrier, 0)))
        .and_then(|s| s.set_nonblocking(true).map(|()| s))
        .map_err(|e| VnicError::Relay(format!("the tunnel's socket on {} in {}: {e}", end.carrier, end.netns)))?;
    Ok((tun, sock))
}

/// One end: packets from `tun` into `sock` and datagrams from `sock` into `tun`, until told
/// to stop.
fn carry(tun: &Tun, sock: &UdpSocket, stop: &AtomicBool, counts: &Counts) {
    let mut buf = vec![0u8; VNET_HDR_LEN + TUNNEL_MTU + 1];
    let mut last_work = Instant::now() - TUNNEL_SPIN;
    while !stop.load(Ordering::Relaxed) {
        let mut worked = false;
        for _ in 0..TUNNEL_BURST {
            match tun.try_read(&mut buf) {
                Ok(0) => break,
                Err(_) => {
                    // A device that fails is not looked at again at once (as the relay's).
                    std::thread::sleep(STOP_CHECK);
                    break;
                }
                Ok(n) => {
                    worked = true;
                    match sock.send(&buf[..n]) {
                        Ok(_) => {
                            counts.packets.fetch_add(1, Ordering::Relaxed);
                            counts.bytes.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(_) => {
                            counts.dropped.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        for _ in 0..TUNNEL_BURST {
            match sock.recv(&mut buf) {
                Ok(n) => {
                    worked = true;
                    if tun.write(&buf[..n]).is_err() {
                        counts.dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Err(_) => break,
            }
        }
        if worked {
            last_work = Instant::now();
            continue;
        }
        // Nothing this pass: look again while the last work is recent (giving the core to a
        // thread of this host that has work first), then sleep until either side is readable.
        let spinning = last_work.elapsed() < TUNNEL_SPIN;
        if spinning {
            std::thread::yield_now();
        }
        let wait = if spinning { Duration::ZERO } else { STOP_CHECK };
        let ts = rustix::time::Timespec { tv_sec: wait.as_secs() as i64, tv_nsec: wait.subsec_nanos() as _ };
        let mut fds = [PollFd::new(tun, PollFlags::IN), PollFd::new(sock, PollFlags::IN)];
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(ns: &str, i: u8) -> TunnelEnd {
        TunnelEnd {
            netns: ns.into(),
            addr: Ipv4Addr::new(198, 19, 101, i),
            carrier: Ipv4Addr::new(198, 19, 0, i),
            cores: vec![],
        }
    }

    // Checks that a tunnel whose two ends name one namespace is refused with a clear error
    // before any device is made (no root needed: nothing reaches the kernel).
    #[test]
    fn both_ends_in_one_namespace_is_refused() {
        let e = UdpTunnel::start(&end("rwr-none-h1", 1), &end("rwr-none-h1", 2)).err().expect("refused");
        assert!(e.to_string().contains("one namespace"), "{e}");
    }

    // Checks that an end in a namespace that does not exist fails with an error naming the
    // tunnel's device and the namespace, and leaves no thread running.
    #[test]
    fn a_missing_namespace_is_named_in_the_error() {
        let e = UdpTunnel::start(&end("rwr-no-such-ns-c", 1), &end("rwr-no-such-ns-d", 2))
            .err()
            .expect("no such namespace");
        assert!(e.to_string().contains("rwr-no-such-ns-c") && e.to_string().contains(TUNNEL_NAME), "{e}");
    }
}
