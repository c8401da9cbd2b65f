//! What the virtual NIC takes from its peers: packets only from a peer's own addresses, with
//! an offload header the kernel can act on safely, and routes only to addresses a peer may
//! own.

use std::net::Ipv4Addr;

use rackwire::NodeId;

use crate::{ipv4_header_destination, VNET_HDR_LEN, VNIC_MTU};

/// Why a packet from a peer is not written into `rw0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxRefusal {
    /// Not a well-formed IPv4 packet behind an offload header.
    Malformed,
    /// An offload header asking for what no packet of ours needs (unknown flags or
    /// segmentation type, a checksum or header outside the packet, a segment size past the MTU).
    BadOffload,
    /// Its source is another node's address, this node's, or a special one.
    Spoofed,
}

/// `virtio_net_hdr` flags: the checksum is to be computed, or is known good.
const F_NEEDS_CSUM: u8 = 1;
const F_DATA_VALID: u8 = 2;
/// `virtio_net_hdr` segmentation types (the ECN bit aside): none, TCPv4, UDP, TCPv6, UDP L4.
const GSO_TYPES: [u8; 5] = [0, 1, 3, 4, 5];
const GSO_ECN: u8 = 0x80;

/// Check a packet node `sender` sent (an offload header, then an IPv4 packet) before it is
/// written into `rw0`: well-formed, with an offload header within bounds, and not speaking for
/// another: its source may be any address of the sender's own host, but not one the
/// management host knows only as other nodes' (`owners`: the nodes that registered an
/// address; nodes of one host share its addresses), not one of this node's own (`mine`), and
/// no special address. (A host may own addresses it did not register, such as a
/// management host's; an address no node registered could be sent from over Ethernet just as
/// well.)
pub fn check_from_peer<'a>(
    data: &[u8],
    sender: NodeId,
    owners: impl Fn(Ipv4Addr) -> Option<&'a [NodeId]>,
    mine: &[Ipv4Addr],
) -> Result<(), RxRefusal> {
    check_head_from_peer(data, data.len(), sender, owners, mine)
}

/// [`check_from_peer`] on the first bytes of a packet of `len` bytes (`head`: at least its
/// offload header and IPv4 header, or all of it): everything it checks is in them.
pub(crate) fn check_head_from_peer<'a>(
    head: &[u8],
    len: usize,
    sender: NodeId,
    owners: impl Fn(Ipv4Addr) -> Option<&'a [NodeId]>,
    mine: &[Ipv4Addr],
) -> Result<(), RxRefusal> {
    let (hdr, packet) = head.split_at_checked(VNET_HDR_LEN).ok_or(RxRefusal::Malformed)?;
    let packet_len = len.checked_sub(VNET_HDR_LEN).ok_or(RxRefusal::Malformed)?;
    ipv4_header_destination(packet, packet_len).ok_or(RxRefusal::Malformed)?;
    let u16_at = |i: usize| u16::from_le_bytes([hdr[i], hdr[i + 1]]) as usize;
    let (flags, gso) = (hdr[0], hdr[1]);
    let (hdr_len, gso_size, csum_start, csum_offset) = (u16_at(2), u16_at(4), u16_at(6), u16_at(8));
    let offload_ok = flags & !(F_NEEDS_CSUM | F_DATA_VALID) == 0
        && GSO_TYPES.contains(&(gso & !GSO_ECN))
        && (flags & F_NEEDS_CSUM == 0 || csum_start + csum_offset + 2 <= packet_len)
        && (gso & !GSO_ECN == 0 || (gso_size > 0 && gso_size <= VNIC_MTU && hdr_len <= packet_len));
    if !offload_ok {
        return Err(RxRefusal::BadOffload);
    }
    let source = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
    if special(source) || mine.contains(&source) || owners(source).is_some_and(|o| !o.contains(&sender)) {
        return Err(RxRefusal::Spoofed);
    }
    Ok(())
}

/// Whether a peer's registered address may be routed through `rw0`: not one of this node's
/// own (`mine`), not the management host's (`mh`), and an ordinary unicast address (not
/// loopback, link-local, multicast, broadcast or unspecified).
pub fn routable(addr: Ipv4Addr, mine: &[Ipv4Addr], mh: &[Ipv4Addr]) -> bool {
    !(special(addr) || addr.is_link_local() || mine.contains(&addr) || mh.contains(&addr))
}

/// The IPv4 addresses in a comma-separated list of `ip:port` (the management host's).
pub fn ipv4_of(list: &str) -> Vec<Ipv4Addr> {
    let addrs: Vec<String> = list.split(',').map(|a| a.trim().to_string()).collect();
    crate::link_addrs(&addrs)
}

/// An address no host sends from or is reached at as itself: loopback, multicast, broadcast,
/// unspecified.
fn special(a: Ipv4Addr) -> bool {
    a.is_loopback() || a.is_multicast() || a.is_broadcast() || a.is_unspecified()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An offload header and a 28-byte IPv4 packet from `src` to 198.18.0.9.
    fn packet(src: [u8; 4], hdr: [u8; VNET_HDR_LEN]) -> Vec<u8> {
        let mut p = hdr.to_vec();
        let mut ip = [0u8; 28];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&28u16.to_be_bytes());
        ip[12..16].copy_from_slice(&src);
        ip[16..20].copy_from_slice(&[198, 18, 0, 9]);
        p.extend_from_slice(&ip);
        p
    }

    // Checks the rules for packets from a peer (node 2, whose host also holds 198.18.0.250,
    // an address it did not register, and runs node 12 on the same addresses): from its own addresses, or one no node registered,
    // with a plain or checksum-offload header, a packet passes; one from another node's
    // address (node 3's), this node's own, or loopback is refused as spoofed; a header with
    // unknown flags or segmentation type, a checksum position outside the packet, or a
    // segmented packet with no segment size is refused as such; a non-IPv4 packet is malformed.
    #[test]
    fn packets_from_a_peer_may_not_speak_for_another() {
        // Node 2 shares its host (and addresses) with node 12.
        let owner_of = |a: Ipv4Addr| -> Option<&'static [NodeId]> {
            match a.octets() {
                [198, 18, _, 2] => Some(&[12, 2]),
                [198, 18, _, 3] => Some(&[3]),
                [198, 18, _, 1] => Some(&[1]),
                _ => None,
            }
        };
        let mine = [Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 1, 1)];
        let check = |src: [u8; 4], hdr| check_from_peer(&packet(src, hdr), 2, owner_of, &mine);
        let plain = [0u8; VNET_HDR_LEN];
        assert_eq!(check([198, 18, 1, 2], plain), Ok(()));
        assert_eq!(check([198, 18, 0, 250], plain), Ok(()), "an address of its host no node registered");
        let mut csum = plain;
        csum[0] = F_NEEDS_CSUM;
        csum[6..8].copy_from_slice(&20u16.to_le_bytes());
        csum[8..10].copy_from_slice(&6u16.to_le_bytes());
        assert_eq!(check([198, 18, 0, 2], csum), Ok(()));
        assert_eq!(check([198, 18, 0, 3], plain), Err(RxRefusal::Spoofed), "another node's address");
        assert_eq!(check([198, 18, 1, 1], plain), Err(RxRefusal::Spoofed), "this node's own address");
        assert_eq!(check([127, 0, 0, 1], plain), Err(RxRefusal::Spoofed));
        let mut flags = plain;
        flags[0] = 0x10;
        assert_eq!(check([198, 18, 0, 2], flags), Err(RxRefusal::BadOffload));
        let mut gso = plain;
        gso[1] = 9;
        assert_eq!(check([198, 18, 0, 2], gso), Err(RxRefusal::BadOffload));
        let mut far = csum;
        far[6..8].copy_from_slice(&1000u16.to_le_bytes());
        assert_eq!(check([198, 18, 0, 2], far), Err(RxRefusal::BadOffload));
        let mut tcp = plain;
        tcp[1] = 1;
        assert_eq!(check([198, 18, 0, 2], tcp), Err(RxRefusal::BadOffload));
        assert_eq!(check_from_peer(&[0u8; 12], 2, owner_of, &mine), Err(RxRefusal::Malformed));
    }

    // Checks which registered addresses may get a route through rw0: a peer's ordinary rail
    // address may; this node's own, the management host's, loopback, link-local, multicast,
    // broadcast and unspecified addresses may not.
    #[test]
    fn only_a_peers_ordinary_addresses_are_routed() {
        let mine = [Ipv4Addr::new(198, 18, 0, 1)];
        let mh = ipv4_of("198.18.0.250:7700, 127.0.0.1:7700");
        assert!(routable(Ipv4Addr::new(198, 18, 0, 2), &mine, &mh));
        for bad in [
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 250),
            Ipv4Addr::LOCALHOST,
            Ipv4Addr::new(169, 254, 1, 1),
            Ipv4Addr::new(224, 0, 0, 1),
            Ipv4Addr::BROADCAST,
            Ipv4Addr::UNSPECIFIED,
        ] {
            assert!(!routable(bad, &mine, &mh), "{bad}");
        }
    }
}
