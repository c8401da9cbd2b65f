//! Frames in and out: a thread's receive and transmit buffers, and sending what the
//! connections have to send, per link in batches (`sendmmsg`, GSO where the link has it).

use proto::FrameBufs;
use rackwire_udp::{Faulty, SendLink};

use super::{
    proto, warn, Bytes, Conns, EdgeEndpoint, FaultInjector, OpError, OutFrame, Pending, RecvBufs, Side, SocketAddr,
    State, SEND_BATCH_MAX, TX_FLUSH_BYTES,
};

/// Buffers of one thread that drives the endpoint: receive buffers, a buffer the connections
/// write frame heads into, and the frames gathered per link for one `sendmmsg`.
pub(super) struct Io {
    pub(super) rx: RecvBufs,
    pub(super) out: Vec<u8>,
    pub(super) tx: Vec<TxLink>,
}

impl Io {
    pub(super) fn new(links: usize) -> Io {
        Io {
            rx: RecvBufs::default(),
            out: vec![0u8; rackwire_udp::UDP_PAYLOAD_MAX + 1],
            tx: (0..links).map(|_| TxLink::new()).collect(),
        }
    }
}

/// Bytes of a link's heads buffer: a batch goes out once it holds [`TX_FLUSH_BYTES`], so
/// there is always room for one more frame of the largest size.
const HEADS_BYTES: usize = TX_FLUSH_BYTES + rackwire_udp::UDP_PAYLOAD_MAX + 1;

/// Frames waiting to go out on one link: their heads laid end to end in one buffer (reused
/// from batch to batch; the connections write them there), their bodies shared with the
/// operations they carry.
pub(super) struct TxLink {
    /// [`HEADS_BYTES`] long; the heads gathered are `heads[..used]`.
    heads: Vec<u8>,
    used: usize,
    pub(super) frames: Vec<(usize, usize, Option<Bytes>, SocketAddr)>,
    /// Bytes of the gathered frames.
    pub(super) bytes: usize,
    /// The frames' lengths, for a send of whole frames from `heads` (reused from batch to batch).
    lens: Vec<usize>,
}

impl TxLink {
    fn new() -> TxLink {
        TxLink { heads: vec![0; HEADS_BYTES], used: 0, frames: Vec::new(), bytes: 0, lens: Vec::new() }
    }

    /// Where the next frame's head goes: behind the ones gathered.
    fn free(&mut self) -> &mut [u8] {
        &mut self.heads[self.used..]
    }
}

/// What the connections write their frames into: the free end of the frame's link's batch
/// (no copy into the batch after), or `out` for a link this thread has no batch for.
struct LinkBufs<'a> {
    tx: &'a mut [TxLink],
    out: &'a mut [u8],
}

impl FrameBufs for LinkBufs<'_> {
    fn frame_buf(&mut self, link: usize) -> &mut [u8] {
        match self.tx.get_mut(link) {
            Some(q) => q.free(),
            None => self.out,
        }
    }
}

/// One gathered frame as the link sends it: its head from `heads`, its body shared.
fn out_frame<'a>(
    heads: &'a [u8],
    (at, len, body, addr): &'a (usize, usize, Option<Bytes>, SocketAddr),
) -> OutFrame<'a> {
    OutFrame { head: &heads[*at..*at + *len], body: body.as_deref().unwrap_or(&[]), to: *addr }
}

/// Count frame `t`, written at the free end of its link's batch, into that batch; the batch,
/// unless the connection has no address or this thread no batch for the link (nothing to send).
fn gather<'a>(
    s: &proto::Session<SocketAddr, Pending>,
    t: proto::SplitTransmit,
    tx: &'a mut [TxLink],
) -> Option<&'a mut TxLink> {
    let addr = s.addr(t.link)?;
    let q = tx.get_mut(t.link)?;
    // The head is already in place, behind the ones gathered.
    let at = q.used;
    q.used += t.head_len;
    q.bytes += t.head_len + t.body.as_ref().map_or(0, Bytes::len);
    q.frames.push((at, t.head_len, t.body, addr));
    Some(q)
}

/// An [`EdgePeer`] stands for the connection: it was opened here, or accepted and connected.
pub(super) fn registered(s: &proto::Session<SocketAddr, Pending>) -> bool {
    !s.accepted() || s.handshake_completed()
}

impl EdgeEndpoint {
    /// Send what every connection has to send, batched per link (a batch goes out once it
    /// holds [`SEND_BATCH_MAX`] frames or [`TX_FLUSH_BYTES`]), through the fault injector where one is configured.
    pub(super) fn transmit(&self, conns: &mut Conns, side: &mut Side, now: proto::Time, io: &mut Io) -> usize {
        let mut sent = 0;
        let faults = &mut side.faults;
        for s in conns.sessions_mut() {
            loop {
                let mut bufs = LinkBufs { tx: &mut io.tx, out: &mut io.out };
                let Some(t) = s.conn_mut().poll_transmit_to(now, &mut bufs) else { break };
                let link = t.link;
                let Some(q) = gather(s, t, &mut io.tx) else { continue };
                if q.frames.len() >= SEND_BATCH_MAX || q.bytes >= TX_FLUSH_BYTES {
                    sent += self.flush(link, q, faults);
                }
            }
        }
        for (l, q) in io.tx.iter_mut().enumerate() {
            if !q.frames.is_empty() {
                sent += self.flush(l, q, faults);
            }
        }
        for local in std::mem::take(&mut side.closing) {
            // Keep queued messages readable: drop the slot once drained by the reader (a peer's
            // new first frame opens a new connection either way). A connection with an
            // `EdgePeer` (opened here, or accepted and connected) goes with its last handle.
            if conns.get(local).is_some_and(|s| s.nothing_to_take() && !registered(s)) {
                conns.remove(local);
                side.gone_asked.remove(&local);
            } else {
                conns.forget_accepted(local);
            }
        }
        sent
    }

    /// `data` as a datagram of connection `local`, sent at once from this thread (see
    /// [`proto::Connection::send_datagram_now`]: nothing else is looked at or gathered before
    /// it goes) together with the datagrams held before it on its link, then what the
    /// connections have to send besides. With `hold`, it stays behind those in its link's
    /// batch for the datagrams that follow, to go out with them in one send (the batch goes
    /// once it holds [`SEND_BATCH_MAX`] frames or [`TX_FLUSH_BYTES`]; the next send or
    /// transmission from this thread's buffers sends it, as [`EdgeEndpoint::send_held`] does).
    pub(super) fn send_datagram_here(
        &self,
        st: &mut State,
        local: u32,
        now: proto::Time,
        data: &[u8],
        io: &mut Io,
        hold: bool,
    ) -> Result<(), OpError> {
        let State { conns, side, .. } = st;
        let faults = &mut side.faults;
        let Some(s) = conns.get_mut(local) else { return Err(OpError::Closed) };
        let mut bufs = LinkBufs { tx: &mut io.tx, out: &mut io.out };
        if let Some(t) = s.conn_mut().send_datagram_now(now, data, &mut bufs)? {
            let link = t.link;
            if let Some(q) = gather(s, t, &mut io.tx) {
                if !hold || q.frames.len() >= SEND_BATCH_MAX || q.bytes >= TX_FLUSH_BYTES {
                    self.flush(link, q, faults);
                }
            }
        }
        if !hold {
            self.transmit(conns, side, now, io);
        }
        Ok(())
    }

    /// Send one link's gathered frames and empty its queue (keeping the buffers).
    pub(super) fn flush(&self, l: usize, q: &mut TxLink, faults: &mut [Option<FaultInjector>]) -> usize {
        let TxLink { heads, used, frames, lens, .. } = q;
        let heads = &heads[..*used];
        let link = &self.socks[l];
        let result = match (faults.get_mut(l).and_then(Option::as_mut), &frames[..]) {
            (Some(faults), frames) => {
                let list: Vec<OutFrame<'_>> = frames.iter().map(|f| out_frame(heads, f)).collect();
                Faulty { inner: link, faults }.send_batch(&list)
            }
            // One frame (the latency case): nothing to gather.
            (None, [one]) => link.send_batch(std::slice::from_ref(&out_frame(heads, one))),
            // Whole frames (a sealed connection's) to one peer lie end to end in `heads`:
            // runs of them go to the kernel from there, not gathered again.
            (None, frames @ [first, ..]) if frames.iter().all(|f| f.2.is_none() && f.3 == first.3) => {
                lens.clear();
                lens.extend(frames.iter().map(|f| f.1));
                link.send_laid(heads, lens, first.3)
            }
            (None, frames) => {
                let list: Vec<OutFrame<'_>> = frames.iter().map(|f| out_frame(heads, f)).collect();
                link.send_batch(&list)
            }
        };
        q.used = 0;
        q.frames.clear();
        q.bytes = 0;
        match result {
            Ok(n) => n,
            Err(e) => {
                warn!(link = l, "send: {e}");
                0
            }
        }
    }
}
