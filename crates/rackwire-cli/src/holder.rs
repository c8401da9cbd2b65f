//! Which process holds a local port: the socket in `/proc/net/{tcp,udp}` (this network
//! namespace's), then the process with a descriptor naming that socket. For `rackwire doctor`,
//! to tell a port the service itself holds from one another program took.

use std::net::{Ipv4Addr, SocketAddr};

/// Whether the socket is TCP (listening) or UDP.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Proto {
    Tcp,
    Udp,
}

/// A process holding a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub pid: u32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
}

/// TCP's state number of a listening socket in `/proc/net/tcp`.
const TCP_LISTEN: &str = "0A";
/// Processes looked through at most.
const PROCESSES_MAX: usize = 100_000;

/// The inodes of the sockets bound to `addr` (or to any address, at its port) in the table
/// `text` (the format of `/proc/net/tcp` and `/proc/net/udp`).
fn inodes(text: &str, proto: Proto, addr: SocketAddr) -> Vec<u64> {
    let SocketAddr::V4(want) = addr else { return Vec::new() };
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (ip, port) = f.get(1)?.split_once(':')?;
            // The address is the kernel's 32-bit word in hex, in this machine's byte order.
            let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_le_bytes());
            let port = u16::from_str_radix(port, 16).ok()?;
            let listening = proto == Proto::Udp || *f.get(3)? == TCP_LISTEN;
            let here = port == want.port() && (ip == *want.ip() || ip.is_unspecified());
            (listening && here).then(|| f.get(9)?.parse().ok())?
        })
        .collect()
}

/// The process holding `addr` over `proto`, if one does (and this process may see it).
pub(crate) fn holder(proto: Proto, addr: SocketAddr) -> Option<Holder> {
    let table = match proto {
        Proto::Tcp => "/proc/net/tcp",
        Proto::Udp => "/proc/net/udp",
    };
    let found = inodes(&std::fs::read_to_string(table).ok()?, proto, addr);
    if found.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten().take(PROCESSES_MAX) {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else { continue };
            let inode = link.to_str().and_then(|s| s.strip_prefix("socket:[")?.strip_suffix(']')?.parse::<u64>().ok());
            if inode.is_some_and(|i| found.contains(&i)) {
                let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default().trim().to_string();
                return Some(Holder { pid, comm });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the table parser on lines in the kernel's format: a listening TCP socket on
    // 127.0.0.1:7700 is found by its address and by a wildcard bind; an established one on the
    // same port is not; a UDP socket bound to 0.0.0.0:7710 holds 198.18.1.2:7710.
    #[test]
    fn sockets_are_found_by_address_and_port() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                   0: 0100007F:1E14 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0\n\
                   1: 0100007F:1E14 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0\n";
        let a: SocketAddr = "127.0.0.1:7700".parse().unwrap();
        assert_eq!(inodes(tcp, Proto::Tcp, a), vec![4242]);
        assert!(inodes(tcp, Proto::Tcp, "127.0.0.1:7701".parse().unwrap()).is_empty());
        let udp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                   5: 00000000:1E1E 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 777 2 0\n";
        assert_eq!(inodes(udp, Proto::Udp, "198.18.1.2:7710".parse().unwrap()), vec![777]);
    }

    // Checks the whole lookup on a real socket: a TCP listener this test opens on loopback is
    // held by this process (its own pid).
    #[test]
    fn a_listener_is_held_by_its_process() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let h = holder(Proto::Tcp, l.local_addr().unwrap()).expect("found");
        assert_eq!(h.pid, std::process::id());
    }
}
