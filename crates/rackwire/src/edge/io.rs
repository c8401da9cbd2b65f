//! Frames in and out: a thread's receive and transmit buffers, and sending what the
//! connections have to send, per link in batches (`sendmmsg`, GSO where the link has it).

use super::*;

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
            tx: (0..links).map(|_| TxLink::default()).collect(),
        }
    }
}

/// Frames waiting to go out on one link: their heads laid end to end in one buffer (reused
/// from batch to batch), their bodies shared with the operations they carry.
#[derive(Default)]
pub(super) struct TxLink {
    pub(super) heads: Vec<u8>,
    pub(super) frames: Vec<(usize, usize, Option<Bytes>, SocketAddr)>,
    /// Bytes of the gathered frames.
    pub(super) bytes: usize,
}

impl EdgeEndpoint {
    /// Send what every connection has to send, batched per link (a batch goes out once it
    /// holds [`SEND_BATCH_MAX`] frames or [`TX_FLUSH_BYTES`]), through the fault injector where one is configured.
    pub(super) fn transmit(&self, st: &mut State, now: proto::Time, io: &mut Io) -> usize {
        let mut sent = 0;
        let State { slots, faults, .. } = st;
        for s in slots.values_mut() {
            while let Some(t) = s.conn.poll_transmit_split(now, &mut io.out) {
                let Some(Some(addr)) = s.addrs.get(t.link) else { continue };
                let Some(q) = io.tx.get_mut(t.link) else { continue };
                let at = q.heads.len();
                q.heads.extend_from_slice(&io.out[..t.head_len]);
                q.bytes += t.head_len + t.body.as_ref().map_or(0, Bytes::len);
                q.frames.push((at, t.head_len, t.body, *addr));
                if q.frames.len() >= SEND_BATCH_MAX || q.bytes >= TX_FLUSH_BYTES {
                    sent += self.flush(t.link, q, faults);
                }
            }
        }
        for (l, q) in io.tx.iter_mut().enumerate() {
            if !q.frames.is_empty() {
                sent += self.flush(l, q, faults);
            }
        }
        sent
    }

    /// Send one link's gathered frames and empty its queue (keeping the buffers).
    pub(super) fn flush(&self, l: usize, q: &mut TxLink, faults: &mut [Option<FaultInjector>]) -> usize {
        let result = match faults.get_mut(l).and_then(Option::as_mut) {
            Some(fi) => {
                // Faults act on whole frames: join the parts (a test path, not a fast one).
                let mut faulty: Vec<(Vec<u8>, SocketAddr)> = Vec::with_capacity(q.frames.len());
                for (at, len, body, addr) in &q.frames {
                    let mut f = q.heads[*at..*at + *len].to_vec();
                    if let Some(b) = body {
                        f.extend_from_slice(b);
                    }
                    let mut outs = Vec::new();
                    fi.apply(&f, &mut outs);
                    faulty.extend(outs.into_iter().map(|o| (o, *addr)));
                }
                let list: Vec<OutFrame<'_>> =
                    faulty.iter().map(|(f, a)| OutFrame { head: f, body: &[], to: *a }).collect();
                self.socks[l].send_batch(&list)
            }
            None if q.frames.len() == 1 => {
                // One frame (the latency case): nothing to gather.
                let (at, len, body, addr) = &q.frames[0];
                let f = OutFrame { head: &q.heads[*at..*at + *len], body: body.as_deref().unwrap_or(&[]), to: *addr };
                self.socks[l].send_batch(std::slice::from_ref(&f))
            }
            None => {
                let list: Vec<OutFrame<'_>> = q
                    .frames
                    .iter()
                    .map(|(at, len, body, addr)| OutFrame {
                        head: &q.heads[*at..*at + *len],
                        body: body.as_deref().unwrap_or(&[]),
                        to: *addr,
                    })
                    .collect();
                self.socks[l].send_batch(&list)
            }
        };
        q.heads.clear();
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
