//! The routing table: which peers run a virtual NIC, their routes through `rw0`, and their
//! counters.

use super::{
    debug, info, ip, link_addrs, routable, warn, Arc, Instant, Ipv4Addr, Map, NodeId, Ordering, Peer, PeerCounters,
    Shared, Table, VnicCounters, VnicError, PEERS_MAX, REFRESH_INTERVAL, STOP_CHECK, VNIC_NAME, VNIC_REGION_PREFIX,
};

impl Shared {
    pub(crate) fn refresh_loop(&self) {
        let mut last = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            std::thread::sleep(STOP_CHECK);
            if last.elapsed() >= REFRESH_INTERVAL {
                self.refresh();
                last = Instant::now();
            }
        }
    }

    /// Learn which nodes run a virtual NIC now: route to the new ones, forget the gone ones.
    pub(crate) fn refresh(&self) {
        let nodes = match self.fabric.nodes() {
            Ok(n) => n,
            Err(e) => {
                debug!("node list: {e}");
                return;
            }
        };
        let me = self.fabric.id();
        let mut owners: Map<Ipv4Addr, Vec<NodeId>> = Map::default();
        for n in &nodes {
            for a in link_addrs(&n.info.links) {
                owners.entry(a).or_default().push(n.info.id);
            }
        }
        self.table.write().unwrap_or_else(|e| e.into_inner()).owners = owners;
        let mut live = Vec::new();
        for n in nodes.iter().filter(|n| n.up && n.info.id != me) {
            let known = self.table.read().unwrap_or_else(|e| e.into_inner()).peers.contains_key(&n.info.id);
            if known {
                live.push(n.info.id);
                continue;
            }
            // Its marker, published by itself (the management host takes `vnic/NAME` from NAME
            // only; checked here too).
            let marker = self.fabric.lookup(&format!("{VNIC_REGION_PREFIX}{}", n.info.name));
            if !marker.is_ok_and(|m| m.node() == n.info.id) {
                continue; // no virtual NIC there: its traffic stays on Ethernet
            }
            let registered = link_addrs(&n.info.links);
            if registered.is_empty() {
                continue;
            }
            let conn = match self.fabric.connect(n.info.id) {
                Ok(c) => c,
                Err(e) => {
                    debug!(peer = n.info.id, "not routed yet: {e}");
                    continue;
                }
            };
            let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
            if table.peers.len() >= PEERS_MAX {
                warn!("virtual NIC peer limit ({PEERS_MAX}) reached; {} stays on Ethernet", n.info.name);
                continue;
            }
            // Only addresses a peer may own, and no other peer's: a node that registers this
            // node's, the management host's or another peer's address gets no route to it.
            let addrs: Vec<Ipv4Addr> = registered
                .iter()
                .copied()
                .filter(|a| routable(*a, &self.my_addrs, &self.mh_addrs) && !table.by_addr.contains_key(a))
                .collect();
            let refused = registered.len() - addrs.len();
            if refused > 0 {
                self.addr_refused.fetch_add(refused as u64, Ordering::Relaxed);
                warn!(peer = %n.info.name, registered = ?registered, "{refused} of the peer's addresses are not routed");
            }
            if addrs.is_empty() {
                continue;
            }
            let mut peer = Peer { name: n.info.name.clone(), addrs, conn, counts: Arc::default(), routed: false };
            for a in &peer.addrs {
                table.by_addr.insert(*a, n.info.id);
            }
            self.routes_version.fetch_add(1, Ordering::Release);
            match self.route(&peer.addrs) {
                Ok(()) => peer.routed = true,
                Err(e) => warn!("routes to {}: {e}", peer.name),
            }
            info!(peer = %peer.name, transport = peer.conn.transport(), addrs = ?peer.addrs, "routed over {VNIC_NAME}");
            table.peers.insert(n.info.id, peer);
            live.push(n.info.id);
        }
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<NodeId> = table.peers.keys().filter(|id| !live.contains(id)).copied().collect();
        for node in gone {
            info!(peer = node, "peer left; its traffic goes back to Ethernet");
            self.forget(&mut table, node);
        }
    }

    /// A `/32` route through `rw0` for each address, from our address on the same rail.
    fn route(&self, addrs: &[Ipv4Addr]) -> Result<(), VnicError> {
        for a in addrs {
            let src = self.my_addrs.iter().find(|m| m.octets()[..3] == a.octets()[..3]).unwrap_or(&self.my_addrs[0]);
            ip(&["route", "replace", &format!("{a}/32"), "dev", VNIC_NAME, "src", &src.to_string()])?;
        }
        Ok(())
    }

    pub(crate) fn forget(&self, table: &mut Table, node: NodeId) {
        let Some(p) = table.peers.remove(&node) else { return };
        self.routes_version.fetch_add(1, Ordering::Release);
        for a in &p.addrs {
            table.by_addr.remove(a);
            if p.routed {
                let _ = ip(&["route", "del", &format!("{a}/32"), "dev", VNIC_NAME]);
            }
        }
        table.gone.push(peer_counters(node, &p));
    }

    pub(crate) fn counters(&self) -> VnicCounters {
        let table = self.table.read().unwrap_or_else(|e| e.into_inner());
        let mut peers: Vec<PeerCounters> = table.peers.iter().map(|(n, p)| peer_counters(*n, p)).collect();
        peers.sort_by_key(|p| p.node);
        peers.extend(table.gone.iter().cloned());
        VnicCounters {
            ifname: self.tun.name().into(),
            peers,
            no_route: self.no_route.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
            rx_unrouted: self.rx_unrouted.load(Ordering::Relaxed),
            rx_spoofed: self.rx_spoofed.load(Ordering::Relaxed),
            rx_bad_offload: self.rx_bad_offload.load(Ordering::Relaxed),
            addr_refused: self.addr_refused.load(Ordering::Relaxed),
        }
    }
}

fn peer_counters(node: NodeId, p: &Peer) -> PeerCounters {
    PeerCounters {
        node,
        name: p.name.clone(),
        addrs: p.addrs.clone(),
        transport: p.conn.transport().into(),
        tx_packets: p.counts.tx_packets.load(Ordering::Relaxed),
        tx_bytes: p.counts.tx_bytes.load(Ordering::Relaxed),
        rx_packets: p.counts.rx_packets.load(Ordering::Relaxed),
        rx_bytes: p.counts.rx_bytes.load(Ordering::Relaxed),
        tx_errors: p.counts.tx_errors.load(Ordering::Relaxed),
    }
}
