//! Datagrams of one UDP flow that arrive together over the edge transport, gathered into one
//! write into `rw0`: a super-packet whose offload header asks the kernel to cut it into the
//! original datagrams (`virtio_net_hdr` UDP L4 segmentation), as a NIC's receive offload
//! hands the kernel a flow's packets together. A flood of small datagrams then costs one write
//! and one pass through the device and the IP layer per run, not per datagram.
//!
//! Only datagrams as a peer's kernel hands them to its `rw0` join a run: IPv4 without options
//! or fragments, checksum left to compute (the header's `NEEDS_CSUM` at the UDP checksum), no
//! segmentation of their own, small enough for two to fit one packet; every one of a run as
//! long as the first but the last, which may be shorter. Anything else is written as it came.

use crate::arrived::Arrived;
use crate::VNET_HDR_LEN;

/// Most datagrams in one super-packet (the kernel cuts at most 64 on older kernels).
pub(crate) const GRO_SEGMENTS_MAX: usize = 64;
/// Most bytes of a super-packet behind its offload header: one IPv4 packet's.
const GRO_PACKET_MAX: usize = 65_535;
const IP_HDR: usize = 20;
const UDP_HDR: usize = 8;
/// Largest datagram payload that joins a run: two of them fit one super-packet (a larger one
/// would only be copied into the run to go in alone).
const GRO_PAYLOAD_MAX: usize = (GRO_PACKET_MAX - IP_HDR - UDP_HDR) / 2;
/// Offload header, IPv4 header, UDP header.
const HDRS: usize = VNET_HDR_LEN + IP_HDR + UDP_HDR;
/// `virtio_net_hdr`: the checksum is to be computed; segmentation type UDP L4.
const F_NEEDS_CSUM: u8 = 1;
const GSO_UDP_L4: u8 = 5;
const GSO_ECN: u8 = 0x80;
/// Where the UDP checksum is, from the start of the IPv4 header.
const UDP_CSUM_START: u16 = IP_HDR as u16;
const UDP_CSUM_OFFSET: u16 = 6;
const IPPROTO_UDP: u8 = 17;

/// What two datagrams of one run share: the IPv4 header's type of service, flags and
/// fragment offset (none), time to live and addresses, and the UDP ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Flow {
    tos: u8,
    frag: [u8; 2],
    ttl: u8,
    addrs: [u8; 8],
    ports: [u8; 4],
}

/// A datagram of `len` bytes that may join a run, from its first bytes `head` (at least
/// its headers): its flow and payload length.
fn candidate(head: &[u8], len: usize) -> Option<(Flow, usize)> {
    if head.len() < HDRS || len < HDRS {
        return None;
    }
    let (v, ip) = head.split_at(VNET_HDR_LEN);
    let ip_len = len - VNET_HDR_LEN;
    let le = |i: usize| u16::from_le_bytes([v[i], v[i + 1]]);
    let be = |i: usize| u16::from_be_bytes([ip[i], ip[i + 1]]) as usize;
    let offload = v[0] == F_NEEDS_CSUM && v[1] == 0 && le(6) == UDP_CSUM_START && le(8) == UDP_CSUM_OFFSET;
    let plain_udp = ip[0] == 0x45 && ip[9] == IPPROTO_UDP && be(6) & 0x3fff == 0;
    let lengths = be(2) == ip_len && be(IP_HDR + 4) == ip_len - IP_HDR;
    let payload = ip_len - IP_HDR - UDP_HDR;
    if !(offload && plain_udp && lengths) || payload == 0 || payload > GRO_PAYLOAD_MAX {
        return None;
    }
    let flow = Flow {
        tos: ip[1],
        frag: [ip[6], ip[7]],
        ttl: ip[8],
        addrs: ip[12..20].try_into().expect("8 bytes"),
        ports: ip[20..24].try_into().expect("4 bytes"),
    };
    Some((flow, payload))
}

/// One's complement sum of `bytes` (big-endian 16-bit words) added to `sum`.
fn sum16(mut sum: u32, bytes: &[u8]) -> u32 {
    let mut chunks = bytes.chunks_exact(2);
    for w in &mut chunks {
        sum += u16::from_be_bytes([w[0], w[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        sum += (*last as u32) << 8;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The datagrams of one flow gathered so far: the first whole (offload header and all), then
/// the others' payloads behind it.
#[derive(Debug)]
pub(crate) struct UdpRun {
    buf: Vec<u8>,
    flow: Option<Flow>,
    /// Payload bytes of each datagram but the last.
    seg: usize,
    /// Datagrams gathered.
    segs: usize,
    /// A shorter datagram ended the run: nothing joins it any more.
    closed: bool,
    /// Where a datagram cut out of the run is built (see [`UdpRun::each`]).
    one: Vec<u8>,
}

impl Default for UdpRun {
    fn default() -> Self {
        UdpRun {
            buf: Vec::with_capacity(VNET_HDR_LEN + GRO_PACKET_MAX),
            flow: None,
            seg: 0,
            segs: 0,
            closed: false,
            one: Vec::new(),
        }
    }
}

impl UdpRun {
    /// Datagrams gathered.
    pub(crate) fn len(&self) -> usize {
        self.segs
    }

    /// Whether packet `second` could follow `first` in a run (the same flow, no longer): a
    /// lone datagram, with nothing to follow it, is written as it came instead.
    pub(crate) fn would_follow(first: &[u8], second: &[u8]) -> bool {
        match (candidate(first, first.len()), candidate(second, second.len())) {
            (Some((a, la)), Some((b, lb))) => a == b && lb <= la,
            _ => false,
        }
    }

    /// Add packet `p` (an offload header, then an IPv4 packet) to the run: true when it joined
    /// (or started) it. False when it may not join this run (its flow, its length, or the
    /// run's limits) or any: the caller passes the run on, and `p` after it.
    pub(crate) fn push(&mut self, p: &Arrived<'_>) -> bool {
        let Some((flow, len)) = candidate(p.head(), p.len()) else { return false };
        if self.segs == 0 {
            self.buf.clear();
            p.extend_from(0, &mut self.buf);
            (self.flow, self.seg, self.segs, self.closed) = (Some(flow), len, 1, false);
            return true;
        }
        let fits = self.buf.len() - VNET_HDR_LEN + len <= GRO_PACKET_MAX;
        if self.flow != Some(flow) || self.closed || len > self.seg || self.segs >= GRO_SEGMENTS_MAX || !fits {
            return false;
        }
        p.extend_from(HDRS, &mut self.buf);
        self.segs += 1;
        self.closed = len < self.seg;
        true
    }

    /// The run as one packet to write: the first datagram as it came when it is alone, else
    /// the super-packet (its headers rewritten for the whole, the kernel to cut it at the
    /// first datagram's payload length). `None` when empty. [`UdpRun::clear`] after.
    pub(crate) fn packet(&mut self) -> Option<&[u8]> {
        match self.segs {
            0 => None,
            1 => Some(&self.buf),
            _ => {
                let payload = self.buf.len() - HDRS;
                write_headers(&mut self.buf[..HDRS], payload, Some(self.seg));
                Some(&self.buf)
            }
        }
    }

    /// Each datagram of the run as it came (its headers rebuilt for its own length), for a
    /// device that refused the super-packet.
    pub(crate) fn each(&mut self, mut f: impl FnMut(&[u8])) {
        let payloads = &self.buf[HDRS..];
        for chunk in payloads.chunks(self.seg.max(1)) {
            self.one.clear();
            self.one.extend_from_slice(&self.buf[..HDRS]);
            self.one.extend_from_slice(chunk);
            write_headers(&mut self.one[..HDRS], chunk.len(), None);
            f(&self.one);
        }
    }

    /// Cut `p`, a super-packet the kernel cuts with UDP L4 segmentation (IPv4 without options),
    /// into its datagrams, each to `f`, as the kernel would (for a device that refuses it):
    /// false, and nothing to `f`, when `p` is no such packet. Uses the run's buffer: call it
    /// on an empty run; it leaves the run empty.
    pub(crate) fn cut(&mut self, p: &Arrived<'_>, f: impl FnMut(&[u8])) -> bool {
        let h = p.head();
        let Some(ip) = h.get(VNET_HDR_LEN..).filter(|_| p.len() > HDRS && h.len() >= HDRS) else { return false };
        let gso_size = u16::from_le_bytes([h[4], h[5]]) as usize;
        let udp = h[1] & !GSO_ECN == GSO_UDP_L4 && ip[0] == 0x45 && ip[9] == IPPROTO_UDP;
        if !udp || gso_size == 0 || self.segs != 0 {
            return false;
        }
        self.buf.clear();
        p.extend_from(0, &mut self.buf);
        (self.seg, self.segs) = (gso_size, 1);
        self.each(f);
        self.clear();
        true
    }

    /// Empty the run.
    pub(crate) fn clear(&mut self) {
        self.segs = 0;
        self.flow = None;
    }
}

/// Rewrite the offload, IPv4 and UDP headers in `h` for `payload` bytes of UDP payload: cut by
/// the kernel into datagrams of `seg` bytes, or one datagram (`None`). The UDP checksum field
/// holds the pseudo-header's sum, for the kernel to finish (it does so per datagram when it
/// cuts).
fn write_headers(h: &mut [u8], payload: usize, seg: Option<usize>) {
    let (v, ip) = h.split_at_mut(VNET_HDR_LEN);
    let (gso, hdr_len, gso_size) = match seg {
        Some(s) => (GSO_UDP_L4, (IP_HDR + UDP_HDR) as u16, s as u16),
        None => (0, 0, 0),
    };
    v[0] = F_NEEDS_CSUM;
    v[1] = gso;
    v[2..4].copy_from_slice(&hdr_len.to_le_bytes());
    v[4..6].copy_from_slice(&gso_size.to_le_bytes());
    v[6..8].copy_from_slice(&UDP_CSUM_START.to_le_bytes());
    v[8..10].copy_from_slice(&UDP_CSUM_OFFSET.to_le_bytes());
    let udp_len = (UDP_HDR + payload) as u16;
    ip[2..4].copy_from_slice(&(IP_HDR as u16 + udp_len).to_be_bytes());
    ip[10..12].copy_from_slice(&[0, 0]);
    let ip_sum = !fold(sum16(0, &ip[..IP_HDR]));
    ip[10..12].copy_from_slice(&ip_sum.to_be_bytes());
    ip[IP_HDR + 4..IP_HDR + 6].copy_from_slice(&udp_len.to_be_bytes());
    let pseudo = sum16(sum16(0, &ip[12..20]), &[0, IPPROTO_UDP]) + udp_len as u32;
    ip[IP_HDR + 6..IP_HDR + 8].copy_from_slice(&fold(pseudo).to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UDP datagram from 198.18.0.1:5000 to 198.18.0.3:`dport` with `n` payload bytes of
    /// `fill`, as a kernel hands it to `rw0` (checksum to compute).
    fn datagram(dport: u16, n: usize, fill: u8) -> Vec<u8> {
        let mut p = vec![0u8; HDRS + n];
        p[HDRS..].fill(fill);
        let ip = &mut p[VNET_HDR_LEN..];
        ip[0] = 0x45;
        ip[6] = 0x40; // don't fragment
        ip[8] = 64;
        ip[9] = IPPROTO_UDP;
        ip[12..16].copy_from_slice(&[198, 18, 0, 1]);
        ip[16..20].copy_from_slice(&[198, 18, 0, 3]);
        ip[20..22].copy_from_slice(&5000u16.to_be_bytes());
        ip[22..24].copy_from_slice(&dport.to_be_bytes());
        write_headers(&mut p[..HDRS], n, None);
        p
    }

    /// `n` datagrams of one flow, 64 bytes of payload each but the last (`last` bytes), each
    /// filled with its number, and the run they make.
    fn run_of(n: u8, last: usize) -> (Vec<Vec<u8>>, UdpRun) {
        let sent: Vec<Vec<u8>> = (0..n).map(|i| datagram(7000, if i + 1 == n { last } else { 64 }, i)).collect();
        let mut run = UdpRun::default();
        for p in &sent {
            assert!(run.push(&Arrived::new(p)));
        }
        (sent, run)
    }

    fn be(b: &[u8], i: usize) -> usize {
        u16::from_be_bytes([b[i], b[i + 1]]) as usize
    }

    // Checks that datagrams of one flow, all as long as the first but a shorter last, make one
    // super-packet: UDP L4 segmentation at the first's payload length, lengths of the whole in
    // the IPv4 and UDP headers, a valid IPv4 header checksum, the pseudo-header's sum in the
    // UDP checksum (computed here independently from the addresses and length), and the
    // payloads in order; and that cut back into datagrams it gives exactly the packets pushed.
    #[test]
    fn a_flows_datagrams_make_one_super_packet_that_cuts_back_into_them() {
        let (sent, mut run) = run_of(5, 30);
        assert_eq!(run.len(), 5);
        let sp = run.packet().expect("a packet").to_vec();
        assert_eq!(&sp[..2], &[F_NEEDS_CSUM, GSO_UDP_L4]);
        assert_eq!(u16::from_le_bytes([sp[2], sp[3]]), 28, "header length");
        assert_eq!(u16::from_le_bytes([sp[4], sp[5]]), 64, "segment size");
        let ip = &sp[VNET_HDR_LEN..];
        let payload = 4 * 64 + 30;
        assert_eq!((be(ip, 2), be(ip, 24)), (28 + payload, 8 + payload));
        assert_eq!(fold(sum16(0, &ip[..20])), 0xffff, "IPv4 header checksum");
        let pseudo = (198 * 256 + 18) + 1 + (198 * 256 + 18) + 3 + 17 + (8 + payload) as u32;
        assert_eq!(be(ip, 26), fold(pseudo) as usize);
        let want: Vec<u8> = sent.iter().flat_map(|p| p[HDRS..].to_vec()).collect();
        assert_eq!(&sp[HDRS..], &want[..]);
        let mut back = Vec::new();
        run.each(|p| back.push(p.to_vec()));
        assert_eq!(back, sent);
        run.clear();
        assert!(run.len() == 0 && run.packet().is_none());
    }

    // Checks what does not join: another flow (port), a longer datagram, any datagram after a
    // shorter one, a datagram past the segment limit; and what never starts a run (a TCP
    // packet, a datagram with its checksum complete, a fragment, a datagram with no payload,
    // one too large for two to fit a packet).
    // A lone datagram is written as it came. `would_follow` agrees with `push` on the flow and
    // the length.
    #[test]
    fn only_a_flows_like_datagrams_join_within_the_limits() {
        let mut run = UdpRun::default();
        assert!(run.push(&Arrived::new(&datagram(7000, 64, 1))));
        assert_eq!(run.packet().unwrap(), &datagram(7000, 64, 1)[..], "a lone datagram as it came");
        assert!(!run.push(&Arrived::new(&datagram(7001, 64, 1))), "another flow");
        assert!(!UdpRun::would_follow(&datagram(7000, 64, 1), &datagram(7001, 64, 1)));
        assert!(!UdpRun::would_follow(&datagram(7000, 64, 1), &datagram(7000, 65, 1)));
        assert!(UdpRun::would_follow(&datagram(7000, 64, 1), &datagram(7000, 10, 1)));
        assert!(!run.push(&Arrived::new(&datagram(7000, 65, 1))), "longer");
        assert!(run.push(&Arrived::new(&datagram(7000, 10, 1))));
        assert!(!run.push(&Arrived::new(&datagram(7000, 10, 1))), "after a shorter one");
        run.clear();
        for _ in 0..GRO_SEGMENTS_MAX {
            assert!(run.push(&Arrived::new(&datagram(7000, 8, 2))));
        }
        assert!(!run.push(&Arrived::new(&datagram(7000, 8, 2))), "past the limit");
        run.clear();
        let mut tcp = datagram(7000, 64, 1);
        tcp[VNET_HDR_LEN + 9] = 6;
        let mut complete = datagram(7000, 64, 1);
        complete[0] = 0;
        let mut fragment = datagram(7000, 64, 1);
        fragment[VNET_HDR_LEN + 6] = 0x20; // more fragments
        for p in [tcp, complete, fragment, datagram(7000, 0, 0), datagram(7000, GRO_PAYLOAD_MAX + 1, 0)] {
            assert!(!run.push(&Arrived::new(&p)) && run.len() == 0);
        }
    }

    // Checks that a super-packet a peer's program made (UDP segmentation at 64 bytes, a
    // shorter last datagram) is cut into exactly the datagrams it stands for; and that a
    // packet that is not one (no segmentation asked) is left alone.
    #[test]
    fn a_peers_super_packet_is_cut_into_its_datagrams() {
        let (sent, mut run) = run_of(3, 20);
        let sp = run.packet().unwrap().to_vec();
        run.clear();
        let mut back = Vec::new();
        assert!(run.cut(&Arrived::new(&sp), |p| back.push(p.to_vec())));
        assert_eq!(back, sent);
        assert_eq!(run.len(), 0);
        assert!(!run.cut(&Arrived::new(&sent[0]), |_| panic!("cut a plain datagram")));
    }

    // Checks that a run stops short of the largest IPv4 packet: datagrams of 1,400 bytes join
    // while the whole stays within 65,535 bytes, and the next is refused.
    #[test]
    fn a_run_stays_within_one_ipv4_packet() {
        let mut run = UdpRun::default();
        let mut n = 0;
        while run.push(&Arrived::new(&datagram(7000, 1_400, 3))) {
            n += 1;
        }
        assert_eq!(n, (GRO_PACKET_MAX - IP_HDR - UDP_HDR) / 1_400);
        let ip = &run.packet().unwrap()[VNET_HDR_LEN..];
        assert!(ip.len() <= GRO_PACKET_MAX && be(ip, 2) == ip.len());
    }
}
