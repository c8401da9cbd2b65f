//! Where a job's ranks, or a benchmark's two ends, run in a virtual rack: the rack brought up
//! for them (or one that is up), its hosts that run programs, and ranks spread over those
//! hosts in blocks.

use std::path::Path;

use crate::{DownOnDrop, HostState, RackConfig, RackError, RackState};

/// Rank `rank` of `ranks` spread in blocks over `hosts` hosts (ranks 0..k on the first, and
/// so on): its host, and its rank among that host's ranks.
pub fn block_place(rank: usize, ranks: usize, hosts: usize) -> (usize, usize) {
    let host = rank * hosts / ranks;
    // The first rank of this host: the smallest r with r·hosts/ranks == host.
    let first = (host * ranks).div_ceil(hosts);
    (host, rank - first)
}

/// Of the pairs of `ranks` ranks placed in blocks over `hosts` hosts ([`block_place`]): how many
/// have their two ranks on different hosts (their TCP crosses a rail), and how many on one host
/// (their TCP goes over the host's loopback).
pub fn pairs_across(ranks: usize, hosts: usize) -> (usize, usize) {
    let host = |r: usize| block_place(r, ranks, hosts.max(1)).0;
    let (mut across, mut within) = (0, 0);
    for a in 0..ranks {
        for b in a + 1..ranks {
            if host(a) == host(b) {
                within += 1;
            } else {
                across += 1;
            }
        }
    }
    (across, within)
}

/// The hosts of a rack that run programs (not the plain Ethernet ones outside it).
pub fn rank_hosts(state: &RackState) -> Vec<&HostState> {
    state.hosts.iter().filter(|h| !h.remote).collect()
}

/// The rack `rack` names: a description (brought up now, its agents run from `exe`; the guard
/// takes it down) or the name of a rack that is up. `no_vnic`: a rack brought up now runs no
/// virtual NIC on any host (so the hosts' TCP between each other takes the rails, not `rw0`).
pub fn up_or_load(rack: &Path, no_vnic: bool, exe: &Path) -> Result<(RackState, Option<DownOnDrop>), RackError> {
    if !rustix::process::geteuid().is_root() {
        return Err(RackError::NotRoot);
    }
    if !rack.is_file() {
        let name = rack.to_string_lossy();
        let state = crate::load(&name).map_err(|e| {
            RackError::NoRack(format!("{name}: neither a rack description nor a rack that is up ({e})"))
        })?;
        return Ok((state, None));
    }
    let text =
        std::fs::read_to_string(rack).map_err(|e| RackError::Config(format!("cannot read {}: {e}", rack.display())))?;
    let mut cfg = RackConfig::parse(&text)?;
    if no_vnic {
        for h in &mut cfg.hosts {
            h.vnic = false;
        }
    }
    let _ = crate::down(Some(&cfg.name));
    let state = crate::up(&cfg, exe)?;
    Ok((state, Some(DownOnDrop(cfg.name.clone()))))
}

/// Bring up the rack `cfg` describes with its first two hosts as two machines, as a paper's
/// two nodes are: memory domains of their own (so they reach each other over the rails only),
/// no virtual NICs; its agents run from `exe`. Its state, and the guard that takes it down.
pub fn two_machines_up(cfg: &mut RackConfig, exe: &Path) -> Result<(RackState, DownOnDrop), RackError> {
    if cfg.hosts.len() < 2 || cfg.hosts[0].remote || cfg.hosts[1].remote {
        return Err(RackError::Config("the rack needs two local hosts first".into()));
    }
    for (i, h) in cfg.hosts.iter_mut().enumerate() {
        h.vnic = false;
        h.domain = Some(format!("d{i}"));
    }
    let _ = crate::down(Some(&cfg.name));
    let state = crate::up(cfg, exe)?;
    Ok((state, DownOnDrop(cfg.name.clone())))
}

#[cfg(test)]
mod tests {
    use super::{block_place, pairs_across};

    // Checks which pairs cross a rail: one rank per host, every pair crosses (4 ranks: 6 of 6);
    // two per host on two hosts (HP's setup on 1l-1g), 4 of 6 cross and 2 stay on one host;
    // one host, none cross.
    #[test]
    fn pairs_across_hosts_are_counted() {
        assert_eq!(pairs_across(4, 4), (6, 0));
        assert_eq!(pairs_across(4, 2), (4, 2));
        assert_eq!(pairs_across(4, 1), (0, 6));
        assert_eq!(pairs_across(8, 4), (24, 4));
    }

    // Checks the block placement: every host gets a contiguous run of ranks, runs differ in
    // length by one at most, and local ranks count from 0 on each host.
    #[test]
    fn blocks_are_contiguous_and_balanced() {
        for ranks in 1..=40 {
            for hosts in 1..=ranks.min(7) {
                let places: Vec<(usize, usize)> = (0..ranks).map(|r| block_place(r, ranks, hosts)).collect();
                let mut per = vec![0usize; hosts];
                for (r, &(h, local)) in places.iter().enumerate() {
                    assert_eq!(local, per[h], "ranks {ranks} hosts {hosts} rank {r}");
                    per[h] += 1;
                    assert!(r == 0 || places[r - 1].0 <= h, "blocks in order");
                }
                let (lo, hi) = (per.iter().min().unwrap(), per.iter().max().unwrap());
                assert!(hi - lo <= 1 && *lo >= 1, "ranks {ranks} hosts {hosts}: {per:?}");
            }
        }
    }
}
