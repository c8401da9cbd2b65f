//! A packet from a peer, its headers copied out of the memory it arrived in before anything
//! looks at them.
//!
//! Over shared memory a packet is handed over where it lies, in the receiver's ring, which
//! the sender can still write: a header checked there could be changed before it is used (the
//! source address checked, then another one written into `rw0`). So the headers — the offload
//! header, the IPv4 header and the UDP ports, everything that is checked or decides where the
//! packet goes — are copied first, and only the copy is checked and passed on; the payload
//! behind them, which nothing checks, is passed on from where it lies (a sender changing it
//! changes only its own packet's data, as it could have sent other data).

use crate::VNET_HDR_LEN;

/// Bytes copied out of every packet: the offload header, the longest IPv4 header (60 bytes)
/// and a UDP header.
pub(crate) const HEAD_BYTES: usize = VNET_HDR_LEN + 60 + 8;

/// A packet from a peer (see the module documentation).
pub(crate) struct Arrived<'a> {
    head: [u8; HEAD_BYTES],
    head_len: usize,
    rest: &'a [u8],
}

impl<'a> Arrived<'a> {
    /// `data` as it arrived: its first [`HEAD_BYTES`] copied.
    pub(crate) fn new(data: &'a [u8]) -> Self {
        let head_len = data.len().min(HEAD_BYTES);
        let mut head = [0u8; HEAD_BYTES];
        head[..head_len].copy_from_slice(&data[..head_len]);
        Arrived { head, head_len, rest: &data[head_len..] }
    }

    /// The copied headers (all of a packet no longer than [`HEAD_BYTES`]).
    pub(crate) fn head(&self) -> &[u8] {
        &self.head[..self.head_len]
    }

    /// Bytes of the whole packet.
    pub(crate) fn len(&self) -> usize {
        self.head_len + self.rest.len()
    }

    /// The packet in its two parts, the copied headers first, to write as one.
    pub(crate) fn parts(&self) -> [&[u8]; 2] {
        [self.head(), self.rest]
    }

    /// Append the packet's bytes from `from` on to `buf` (the headers from the copy).
    pub(crate) fn extend_from(&self, from: usize, buf: &mut Vec<u8>) {
        if from < self.head_len {
            buf.extend_from_slice(&self.head[from..self.head_len]);
            buf.extend_from_slice(self.rest);
        } else {
            buf.extend_from_slice(&self.rest[from - self.head_len..]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that the packet is whole in its parts, and that its headers are a copy: for a
    // short packet and a long one, the parts put together are the packet, `extend_from` gives
    // its bytes from any point (inside and past the headers), and the headers lie outside the
    // memory the packet arrived in (so a sender writing that memory cannot change them) while
    // the payload part lies in it (no copy of what nothing checks).
    #[test]
    fn headers_are_copied_and_the_packet_stays_whole() {
        for n in [10, HEAD_BYTES, HEAD_BYTES + 500] {
            let data: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let a = Arrived::new(&data);
            assert_eq!(a.len(), n);
            assert_eq!(a.parts().concat(), data);
            for from in [0, 5, HEAD_BYTES.min(n), n] {
                let mut buf = Vec::new();
                a.extend_from(from, &mut buf);
                assert_eq!(buf, data[from..], "from {from} of {n}");
            }
            let arrived_in = data.as_ptr_range();
            assert!(!arrived_in.contains(&a.head().as_ptr()), "the headers are read where they arrived");
            if n > HEAD_BYTES {
                assert_eq!(a.parts()[1].as_ptr(), data[HEAD_BYTES..].as_ptr(), "the payload is not copied");
            }
        }
    }

    // Checks the case the copy is for, on a real shared ring (issue: a sender could change a
    // packet after rw0 checked it): a peer pushes a packet from 198.18.0.2 (its own address)
    // into the receiver's ring; while the receiver holds it in place, the peer rewrites its
    // source to 198.18.0.7 (another node's) through its own mapping. The bytes in the ring
    // changed (the check on them now says spoofed), but the copied headers still say
    // 198.18.0.2: what is checked is what goes into rw0.
    #[test]
    fn a_sender_rewriting_its_packet_in_the_ring_changes_no_checked_header() {
        use rackwire_shm::ring::{RingReceiver, RingSender};
        use rackwire_shm::{MapAccess, SharedMem};
        use std::net::Ipv4Addr;
        let mut rx = RingReceiver::create("arrived", 4096).unwrap();
        let dup = || SharedMem::from_fd(rustix::io::dup(rx.mem().fd()).unwrap(), MapAccess::ReadWrite).unwrap();
        let mut tx = RingSender::attach(dup()).unwrap();
        let peer = dup();
        let mut packet = vec![0u8; VNET_HDR_LEN + 28];
        let ip = &mut packet[VNET_HDR_LEN..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&28u16.to_be_bytes());
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[198, 18, 0, 2]);
        ip[16..20].copy_from_slice(&[198, 18, 0, 9]);
        tx.push(1, &[&packet]).unwrap();
        let (a7, a2) = (Ipv4Addr::new(198, 18, 0, 7), Ipv4Addr::new(198, 18, 0, 2));
        let owners = |a: Ipv4Addr| -> Option<&'static [u32]> {
            match a {
                a if a == a7 => Some(&[7]),
                a if a == a2 => Some(&[2]),
                _ => None,
            }
        };
        let held = rx
            .pop_with(|_, payload| {
                let p = Arrived::new(payload);
                // The record's payload starts 16 bytes past the record's header, at the ring's
                // data start (256): the source address is 12 bytes into the IPv4 header.
                let at = 256 + 16 + VNET_HDR_LEN as u64 + 12;
                assert!(peer.write_at(at, &[198, 18, 0, 7]));
                let in_ring = crate::check::check_from_peer(payload, 2, owners, &[]);
                let copied = crate::check::check_head_from_peer(p.head(), p.len(), 2, owners, &[]);
                (in_ring, copied, p.parts().concat())
            })
            .unwrap()
            .unwrap();
        assert_eq!(held.0, Err(crate::RxRefusal::Spoofed), "the ring's bytes changed under the receiver");
        assert_eq!(held.1, Ok(()), "the copied headers were checked");
        assert_eq!(&held.2[VNET_HDR_LEN + 12..VNET_HDR_LEN + 16], &[198, 18, 0, 2], "the copy goes on, as checked");
    }
}
