//! Packets from peers into `rw0`: checked, counted, written; the datagrams of one UDP flow
//! received together (a batch the edge transport hands over, a look at the shared-memory
//! rings) gathered into one write (see `gro`).

use std::sync::Weak;

use rackwire::EdgeMessageHandler;

use super::{debug, warn, Arc, Counts, Ipv4Addr, NodeId, Ordering, RxRefusal, Shared, VNIC_NAME};
use crate::arrived::Arrived;
use crate::check::check_head_from_peer;
use crate::gro::UdpRun;

impl Shared {
    /// Whether the packet `from` sent may go into `rw0` (refused ones are counted): its
    /// peer's counters if so (`None` inside: a peer this side has not routed yet).
    fn admit(&self, from: NodeId, p: &Arrived<'_>) -> Option<Option<Arc<Counts>>> {
        // Every sender is an admitted, authenticated fabric node, and speaks for no other
        // (see `check_from_peer`). One this side has not routed yet (it saw us first) is
        // delivered too, and counted apart.
        let (checked, counts) = {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            let owners = |a: Ipv4Addr| table.owners.get(&a).map(Vec::as_slice);
            let checked = check_head_from_peer(p.head(), p.len(), from, owners, &self.my_addrs);
            (checked, table.peers.get(&from).map(|p| p.counts.clone()))
        };
        let refused = match checked {
            Ok(()) => return Some(counts),
            Err(RxRefusal::Malformed) => &self.malformed,
            Err(RxRefusal::Spoofed) => &self.rx_spoofed,
            Err(RxRefusal::BadOffload) => &self.rx_bad_offload,
        };
        refused.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// A packet of `n` bytes from a peer (its counters, if routed) went into `rw0`.
    fn count_rx(&self, counts: Option<&Counts>, n: usize) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        match counts {
            Some(c) => {
                c.rx_packets.fetch_add(1, Ordering::Relaxed);
                c.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            None => {
                self.rx_unrouted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A packet from `from` received with others (a batch the edge transport handed over, or
    /// the messages one look at the rings took): it joins `run`, the datagrams gathered so far,
    /// if it can (counted as delivered then), else the run goes into `rw0` and the packet
    /// starts the next one, or, when `next` is known not to follow it, goes in as it came (no
    /// copy on a lone packet's way). [`Shared::pass_on`] at the batch's end.
    pub(crate) fn deliver_gathering(&self, run: &mut UdpRun, from: NodeId, data: &[u8], next: Next<'_>) {
        // Checked and passed on from a copy of its headers: the sender may still write the
        // memory `data` lies in (see `arrived`).
        let p = Arrived::new(data);
        let Some(counts) = self.admit(from, &p) else { return };
        let gathering = !self.gathering_refused.load(Ordering::Relaxed);
        if gathering && run.len() > 0 && run.push(&p) {
            return self.count_rx(counts.as_deref(), p.len());
        }
        self.pass_on(run);
        let starts = match next {
            Next::Unknown => true,
            Next::Is(next) => next.is_some_and(|n| UdpRun::would_follow(data, n)),
        };
        if gathering && starts && run.push(&p) {
            return self.count_rx(counts.as_deref(), p.len());
        }
        self.write_one(run, &p, counts.as_deref());
    }

    /// A packet that joins no run into `rw0`; a super-packet of UDP datagrams (a peer's
    /// program sent them with UDP segmentation offload) that the device refuses (a kernel
    /// without UDP segmentation) cut into its datagrams here, in `run`'s buffer (empty now).
    fn write_one(&self, run: &mut UdpRun, p: &Arrived<'_>, counts: Option<&Counts>) {
        let refused = match self.tun.write_parts(&p.parts()) {
            Ok(()) => return self.count_rx(counts, p.len()),
            Err(e) => e,
        };
        let mut failed = None;
        let cut = run.cut(p, |d| {
            if let Err(e) = self.tun.write(d) {
                failed = Some(e);
            }
        });
        match failed {
            None if cut => self.count_rx(counts, p.len()),
            Some(e) => debug!("writing {VNIC_NAME}: {e}"),
            None => debug!("writing {VNIC_NAME}: {refused}"),
        }
    }

    /// The run gathered so far into `rw0`: one write, or, where the device refuses the
    /// super-packet (a kernel without UDP segmentation), a write per datagram, and no more
    /// gathering from then on.
    pub(crate) fn pass_on(&self, run: &mut UdpRun) {
        let Some(packet) = run.packet() else { return };
        if let Err(e) = self.tun.write(packet) {
            if run.len() > 1 {
                if !self.gathering_refused.swap(true, Ordering::Relaxed) {
                    warn!(
                        "{VNIC_NAME} refused {} datagrams as one packet ({e}): written one by one from now on",
                        run.len()
                    );
                }
                run.each(|p| {
                    if let Err(e) = self.tun.write(p) {
                        debug!("writing {VNIC_NAME}: {e}");
                    }
                });
            } else {
                debug!("writing {VNIC_NAME}: {e}");
            }
        }
        run.clear();
    }
}

/// What comes after a packet in its batch: not known (messages taken one at a time), or the
/// next packet, if any.
pub(crate) enum Next<'a> {
    Unknown,
    Is(Option<&'a [u8]>),
}

/// The edge transport's message handler: each packet from a peer in another rack into `rw0`
/// from the thread that received it, a flow's datagrams received together in one write.
/// (A weak reference: the fabric holds the handler.)
pub(crate) struct EdgeRx(pub(crate) Weak<Shared>);

impl EdgeMessageHandler for EdgeRx {
    fn messages(&self, batch: &[(NodeId, Vec<u8>)]) {
        let Some(s) = self.0.upgrade() else { return };
        // The edge transport hands batches over one at a time: no one waits for this lock.
        let mut run = s.gathered.lock().unwrap_or_else(|e| e.into_inner());
        for (i, (from, data)) in batch.iter().enumerate() {
            let next = batch.get(i + 1).map(|(_, d)| d.as_slice());
            s.deliver_gathering(&mut run, *from, data, Next::Is(next));
        }
        s.pass_on(&mut run);
    }
}
