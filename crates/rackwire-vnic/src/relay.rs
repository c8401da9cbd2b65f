//! A bare TUN-to-TUN relay between two network namespaces: the limit of any NIC built on a
//! TUN device.
//!
//! One TUN device in each namespace, set up as `rw0` is (same MTU, offload header, checksum
//! and segmentation offload), and one thread per direction that reads a packet from one
//! device and writes it, offload header and all, into the other. Nothing is in between: no
//! fabric, no ring, no hand-over to another thread, no check. What a packet costs here (a
//! read, a write, a wake-up of the relaying thread) every TUN-based virtual NIC pays too, so
//! `rackwire bench vnic` measures it beside `rw0` to tell how much of `rw0`'s distance from a
//! veth pair is the TUN device's and how much is rackwire's.

use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use rustix::thread::LinkNameSpaceType;

use crate::{ip, Tun, VnicError, STOP_CHECK, VNET_HDR_LEN, VNIC_MTU};

/// The relay's interface name in both namespaces.
pub const RELAY_NAME: &str = "rt0";
/// Prefix length of the relay's subnet: the two ends' addresses are on one link.
const RELAY_PREFIX: u8 = 24;

/// One end of the relay: a network namespace (as `ip netns` names it), the address the
/// relay's device gets there, and the cores of the thread that reads it (empty: any).
#[derive(Clone, Debug)]
pub struct RelayEnd {
    /// Namespace name (`/run/netns/NAME`).
    pub netns: String,
    /// Address of the end's device, on a /24 shared with the other end's.
    pub addr: Ipv4Addr,
    /// Cores the thread that reads this end's device runs on (its host's, in a virtual rack
    /// whose hosts have cores of their own).
    pub cores: Vec<usize>,
}

/// Packets and bytes relayed, per direction, and packets the far device did not take.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) packets: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

/// Two threads that move packets until told to stop, each with its counters; stopped (and
/// joined) when dropped. What the relay and the tunnel (`crate::tunnel`) share.
pub(crate) struct Pair {
    stop: Arc<AtomicBool>,
    counts: Arc<[Counts; 2]>,
    threads: Vec<JoinHandle<()>>,
}

/// What one of a [`Pair`]'s threads runs: until the flag says stop, counting into its counters.
pub(crate) type Work = Box<dyn FnOnce(&AtomicBool, &Counts) + Send>;

impl Pair {
    /// Start `work[k]` on a thread named `{name}-{k}`, held to `cores[k]` (empty: any).
    pub(crate) fn start(name: &str, work: [Work; 2], cores: [&[usize]; 2]) -> Result<Pair, VnicError> {
        let stop = Arc::new(AtomicBool::new(false));
        let counts: Arc<[Counts; 2]> = Arc::new([Counts::default(), Counts::default()]);
        let mut pair = Pair { stop, counts, threads: Vec::new() };
        for (k, w) in work.into_iter().enumerate() {
            let (stop, counts) = (pair.stop.clone(), pair.counts.clone());
            let on = cores[k].to_vec();
            let (held, is_held) = std::sync::mpsc::sync_channel(1);
            let h = std::thread::Builder::new()
                .name(format!("{name}-{k}"))
                .spawn(move || {
                    let r = hold_to(&on);
                    let ok = r.is_ok();
                    let _ = held.send(r);
                    if ok {
                        w(&stop, &counts[k]);
                    }
                })
                .map_err(|e| VnicError::Relay(format!("starting a thread: {e}")))?;
            pair.threads.push(h);
            // The other thread (if started) stops when `pair` drops.
            match is_held.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(VnicError::Relay(format!("holding {name}-{k} to cores {:?}: {e}", cores[k]))),
                Err(_) => return Err(VnicError::Relay(format!("{name}-{k} ended before it started"))),
            }
        }
        Ok(pair)
    }

    /// One counter of both threads.
    pub(crate) fn count(&self, which: impl Fn(&Counts) -> &AtomicU64) -> [u64; 2] {
        [0, 1].map(|k| which(&self.counts[k]).load(Ordering::Relaxed))
    }

    /// Stop both threads and wait for them.
    pub(crate) fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running relay; stopping or dropping it removes both devices.
pub struct TunRelay(Pair);

impl TunRelay {
    /// Create the relay's device in both namespaces, address them, and start relaying.
    pub fn start(a: &RelayEnd, b: &RelayEnd) -> Result<TunRelay, VnicError> {
        if a.netns == b.netns {
            return Err(VnicError::Relay("both ends in one namespace".into()));
        }
        // Entering a namespace changes the calling thread's: do it in a thread of its own,
        // which ends once both devices exist (a TUN device stays in the namespace it was
        // made in, whichever thread then reads it).
        let (ta, tb) = {
            let (a, b) = (a.netns.clone(), b.netns.clone());
            std::thread::spawn(move || Ok::<_, VnicError>((tun_in(&a, RELAY_NAME)?, tun_in(&b, RELAY_NAME)?)))
                .join()
                .map_err(|_| VnicError::Relay("its set-up thread panicked".into()))??
        };
        set_up(&a.netns, &ta, VNIC_MTU, a.addr, RELAY_PREFIX)?;
        set_up(&b.netns, &tb, VNIC_MTU, b.addr, RELAY_PREFIX)?;
        let (ta, tb) = (Arc::new(ta), Arc::new(tb));
        let work =
            |from: Arc<Tun>, to: Arc<Tun>| -> Work { Box::new(move |stop, counts| relay(&from, &to, stop, counts)) };
        let cores = [a.cores.as_slice(), b.cores.as_slice()];
        Ok(TunRelay(Pair::start("rw-relay", [work(ta.clone(), tb.clone()), work(tb, ta)], cores)?))
    }

    /// Packets relayed so far, a to b and b to a.
    pub fn packets(&self) -> [u64; 2] {
        self.0.count(|c| &c.packets)
    }

    /// Bytes relayed so far (offload headers included), a to b and b to a.
    pub fn bytes(&self) -> [u64; 2] {
        self.0.count(|c| &c.bytes)
    }

    /// Packets the far device refused, a to b and b to a.
    pub fn dropped(&self) -> [u64; 2] {
        self.0.count(|c| &c.dropped)
    }

    /// Stop relaying; the devices go with the last handle (the relaying threads hold them).
    pub fn stop(&mut self) {
        self.0.stop();
    }
}

/// Hold the calling thread to `cores` (empty: leave it as it is).
fn hold_to(cores: &[usize]) -> std::io::Result<()> {
    if cores.is_empty() {
        return Ok(());
    }
    let mut set = rustix::thread::CpuSet::new();
    for &c in cores {
        if c >= rustix::thread::CpuSet::MAX_CPU {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no core {c}")));
        }
        set.set(c);
    }
    Ok(rustix::thread::sched_setaffinity(None, &set)?)
}

/// Make a TUN device named `name` in namespace `netns` (this thread moves into it).
pub(crate) fn tun_in(netns: &str, name: &str) -> Result<Tun, VnicError> {
    enter(netns).map_err(|err| VnicError::Tun { name: format!("{name} in {netns}"), err })?;
    Tun::create(name).map_err(|err| VnicError::Tun { name: format!("{name} in {netns}"), err })
}

/// Move this thread into network namespace `netns` (`/run/netns/NAME`).
fn enter(netns: &str) -> std::io::Result<()> {
    let ns = std::fs::File::open(format!("/run/netns/{netns}"))?;
    rustix::thread::move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))?;
    Ok(())
}

/// Bring a device made by [`tun_in`] up in `netns` as `rw0` is (`mtu`; segmentation offload
/// only where super-packets fit one read) and give it `addr/prefix`.
pub(crate) fn set_up(netns: &str, tun: &Tun, mtu: usize, addr: Ipv4Addr, prefix: u8) -> Result<(), VnicError> {
    let name = tun.name();
    let mtu = mtu.to_string();
    ip(&["-n", netns, "link", "set", "dev", name, "mtu", &mtu, "up"])?;
    if ip(&["-n", netns, "link", "set", "dev", name, "gso_max_size", &mtu]).is_err() {
        tun.set_offload(false).map_err(|err| VnicError::Tun { name: name.into(), err })?;
    }
    ip(&["-n", netns, "addr", "add", &format!("{addr}/{prefix}"), "dev", name])
}

/// Packets from `from` into `to` until told to stop.
fn relay(from: &Tun, to: &Tun, stop: &AtomicBool, counts: &Counts) {
    let mut buf = vec![0u8; VNET_HDR_LEN + VNIC_MTU + 1];
    while !stop.load(Ordering::Relaxed) {
        let n = match from.read_timeout(&mut buf, STOP_CHECK) {
            Ok(0) => continue,
            Ok(n) => n,
            Err(_) => {
                std::thread::sleep(STOP_CHECK);
                continue;
            }
        };
        match to.write(&buf[..n]) {
            Ok(()) => {
                counts.packets.fetch_add(1, Ordering::Relaxed);
                counts.bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(_) => {
                counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a relay whose two ends name one namespace is refused with a clear error
    // before any device is made (no root needed: nothing reaches the kernel).
    #[test]
    fn both_ends_in_one_namespace_is_refused() {
        let end = RelayEnd { netns: "rwr-none-h1".into(), addr: Ipv4Addr::new(198, 19, 100, 1), cores: vec![] };
        let e = TunRelay::start(&end, &end).err().expect("refused");
        assert!(e.to_string().contains("one namespace"), "{e}");
    }

    // Checks that an end in a namespace that does not exist fails with an error naming the
    // device and the namespace, and leaves no thread running.
    #[test]
    fn a_missing_namespace_is_named_in_the_error() {
        let a = RelayEnd { netns: "rwr-no-such-ns-a".into(), addr: Ipv4Addr::new(198, 19, 100, 1), cores: vec![] };
        let b = RelayEnd { netns: "rwr-no-such-ns-b".into(), addr: Ipv4Addr::new(198, 19, 100, 2), cores: vec![] };
        let e = TunRelay::start(&a, &b).err().expect("no such namespace");
        assert!(e.to_string().contains("rwr-no-such-ns-a"), "{e}");
    }
}
