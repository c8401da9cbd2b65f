//! Two hosts in network namespaces, joined by two veth links (addresses from 198.18.0.0/15),
//! talking over the edge transport; one link really goes down (`ip link set down`) in the
//! middle of a stream. Needs root; skips with a message otherwise. The namespaces are removed
//! afterwards, also when the test fails.

use std::process::Command;
use std::time::Duration;

use rackwire_tests::{hex, is_root, Node};

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Two namespaces `a` and `b` with links `a0`–`b0` (198.18.0.0/24) and `a1`–`b1` (198.18.1.0/24):
/// the same addresses in every test, which cannot clash, as each test's namespaces are its own.
struct Hosts {
    a: String,
    b: String,
    prefix: String,
}

impl Hosts {
    /// Hosts for one test, told apart from other tests' by `tag` (one letter).
    fn up(tag: char) -> Hosts {
        let p = format!("rwt{}{tag}", std::process::id() % 100_000);
        // Leftovers of an earlier run that crashed (its process is gone) go first.
        if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                let pid = name.strip_prefix("rwt").map(|r| r.trim_end_matches(|c: char| c.is_ascii_alphabetic()));
                if let Some(pid) = pid.and_then(|p| p.parse::<u32>().ok()) {
                    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                        let _ = Command::new("ip").args(["netns", "del", name]).status();
                    }
                }
            }
        }
        let h = Hosts { a: format!("{p}a"), b: format!("{p}b"), prefix: p };
        ip(&["netns", "add", &h.a]);
        ip(&["netns", "add", &h.b]);
        for k in 0..2 {
            let (va, vb) = (format!("{}a{k}", h.prefix), format!("{}b{k}", h.prefix));
            ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]);
            ip(&["link", "set", &va, "netns", &h.a]);
            ip(&["link", "set", &vb, "netns", &h.b]);
            ip(&["-n", &h.a, "addr", "add", &format!("198.18.{k}.1/24"), "dev", &va]);
            ip(&["-n", &h.b, "addr", "add", &format!("198.18.{k}.2/24"), "dev", &vb]);
            ip(&["-n", &h.a, "link", "set", &va, "up"]);
            ip(&["-n", &h.b, "link", "set", &vb, "up"]);
        }
        ip(&["-n", &h.a, "link", "set", "lo", "up"]);
        ip(&["-n", &h.b, "link", "set", "lo", "up"]);
        h
    }

    fn link_down(&self, k: usize) {
        self.set_link(k, false);
    }

    fn set_link(&self, k: usize, up: bool) {
        ip(&["-n", &self.a, "link", "set", &format!("{}a{k}", self.prefix), if up { "up" } else { "down" }]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace removes its veth ends, and with them their peers.
        let _ = Command::new("ip").args(["netns", "del", &self.a]).status();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).status();
    }
}

// Checks the edge transport between two hosts over two real (veth) links: a write with a
// notification, a read back and an atomic across the namespaces; then an 8 MiB stream during
// which link 1 is taken down on host a, which completes and arrives byte-exact. Both hosts ask
// for 8972-byte frames on interfaces of MTU 1500: each link takes what its interface carries
// (1472 bytes), which both ends' statistics report. Afterwards no namespace of the test is
// left.
#[test]
fn two_hosts_over_two_links_survive_a_link_going_down() {
    if !is_root() {
        eprintln!("skipped: network namespaces need root (CI runs this as root)");
        return;
    }
    let hosts = Hosts::up('d');
    let names = (hosts.a.clone(), hosts.b.clone());
    {
        let (_mh, mh) = Node::mh_in_netns(&hosts.a, "198.18.0.1:0");
        let jumbo = (rackwire::vars::LINK_MTU, "8972");
        let env_a = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "198.18.0.1:0,198.18.1.1:0"), jumbo];
        let env_b = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "198.18.0.2:0,198.18.1.2:0"), jumbo];
        let mut owner = Node::spawn_in_netns(&hosts.a, &mh, "ns-owner", &env_a);
        let mut init = Node::spawn_in_netns(&hosts.b, &mh, "ns-init", &env_b);
        let total: u64 = 8 << 20;
        let a = owner.ok(&format!("alloc {total} rwa"));
        let (rid, h) = a.split_once(' ').unwrap();
        owner.ok(&format!("grant {rid} {} rwa", init.id));
        assert_eq!(init.ok(&format!("connect {}", owner.id)), "edge");
        init.ok(&format!("write {h} 64 {} notify=9", hex(b"across namespaces")));
        assert_eq!(owner.ok("notif 5000"), format!("{} {rid} 64 17 9", init.id));
        assert_eq!(init.ok(&format!("read {h} 64 17")), hex(b"across namespaces"));
        assert_eq!(init.ok(&format!("fadd {h} 0 5")), "0");
        let (owner_id, init_id) = (owner.id, init.id);
        for (n, peer) in [(&mut init, owner_id), (&mut owner, init_id)] {
            let stats: serde_json::Value = serde_json::from_str(&n.ok(&format!("stats {peer}"))).unwrap();
            assert_eq!(stats["frame_max"], 1472, "{}: {stats}", n.name);
        }

        init.start_cmd(&format!("stream {h} {total} 262144 20 5"));
        std::thread::sleep(Duration::from_millis(150));
        hosts.link_down(1);
        let done = init.line();
        assert!(done.starts_with("ok"), "stream: {done}");
        assert_eq!(owner.cmd(&format!("check-pattern {rid} 0 {total} 5")), "ok");
    }
    drop(hosts);
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(!list.contains(&names.0) && !list.contains(&names.1), "namespaces left behind: {list}");
}

// Checks that a connection rides out links that come and go on real interfaces: during a
// paced 16 MiB stream (about five seconds) between the two hosts, link 0 drops and returns
// three times, link 1 twice, then both are down together for 1.5 s and come back in the other
// order, and once more both go down one after the other and return in the order they left.
// No moment of total silence comes near the peer timeout (10 s): the stream completes on the
// same connection and arrives byte-exact, and the sender saw links go down.
#[test]
fn a_stream_survives_links_flapping_and_all_links_down_at_once() {
    if !is_root() {
        eprintln!("skipped: network namespaces need root (CI runs this as root)");
        return;
    }
    let hosts = Hosts::up('f');
    {
        let (_mh, mh) = Node::mh_in_netns(&hosts.a, "198.18.0.1:0");
        let env_a = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "198.18.0.1:0,198.18.1.1:0")];
        let env_b = [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "198.18.0.2:0,198.18.1.2:0")];
        let mut owner = Node::spawn_in_netns(&hosts.a, &mh, "flap-owner", &env_a);
        let mut init = Node::spawn_in_netns(&hosts.b, &mh, "flap-init", &env_b);
        let total: u64 = 16 << 20;
        let a = owner.ok(&format!("alloc {total} rw"));
        let (rid, h) = a.split_once(' ').unwrap();
        owner.ok(&format!("grant {rid} {} rw", init.id));
        assert_eq!(init.ok(&format!("connect {}", owner.id)), "edge");
        init.start_cmd(&format!("stream {h} {total} 65536 20 11"));
        // (ms after the start, link, up): every step bounded; the longest total silence 1.5 s.
        let schedule: &[(u64, usize, bool)] = &[
            (200, 0, false),
            (350, 0, true),
            (450, 0, false),
            (520, 0, true),
            (600, 0, false),
            (900, 0, true),
            (1000, 1, false),
            (1100, 1, true),
            (1200, 1, false),
            (1300, 1, true),
            (1500, 0, false),
            (1500, 1, false),
            (3000, 1, true),
            (3200, 0, true),
            (3600, 0, false),
            (3700, 1, false),
            (4300, 0, true),
            (4400, 1, true),
        ];
        let t0 = std::time::Instant::now();
        for &(at, k, up) in schedule {
            let wait = Duration::from_millis(at).saturating_sub(t0.elapsed());
            std::thread::sleep(wait);
            hosts.set_link(k, up);
        }
        let done = init.line();
        assert!(done.starts_with("ok"), "stream: {done}");
        let ms: u64 = done.trim_start_matches("ok ").parse().unwrap();
        assert!(ms > 4400, "the stream ran through every change (took {ms} ms)");
        assert_eq!(owner.cmd(&format!("check-pattern {rid} 0 {total} 11")), "ok");
        let stats: serde_json::Value = serde_json::from_str(&init.ok(&format!("stats {}", owner.id))).unwrap();
        assert!(stats["retransmits"].as_u64().unwrap_or(0) > 0 || stats["losses"].as_u64().unwrap_or(0) > 0, "{stats}");
    }
}

// Checks a rail with a narrow switch on it: link 0 is a plain veth of MTU 9000; link 1 goes
// through a bridge in a third namespace whose port toward host b has MTU 1500 (a switch that
// drops longer frames without a word), while every host interface says 9000. Both hosts ask
// for 8972-byte frames: the handshake agrees on 8972 (what the interfaces announce), the
// padded probes find that link 1 carries only 1452 (the rung for a 1500-byte MTU), and an
// 8 MiB stream over both links arrives byte-exact in frames that short, retransmitting next to
// nothing (a frame too long for the bridge would be lost on every try).
#[test]
fn a_narrow_switch_on_a_rail_is_found_and_its_frames_fit() {
    if !is_root() {
        eprintln!("skipped: network namespaces need root (CI runs this as root)");
        return;
    }
    let hosts = Hosts::up('n');
    let switch = format!("{}s", hosts.prefix);
    ip(&["netns", "add", &switch]);
    // Link 1 rebuilt through the switch: a1 -- sa (bridge port, 9000) | sb (port, 1500) -- b1.
    let (a1, b1) = (format!("{}a1", hosts.prefix), format!("{}b1", hosts.prefix));
    let (sa, sb, br) = (format!("{}sa", hosts.prefix), format!("{}sb", hosts.prefix), format!("{}br", hosts.prefix));
    ip(&["-n", &hosts.a, "link", "del", &a1]);
    for (end, port, host) in [(&a1, &sa, &hosts.a), (&b1, &sb, &hosts.b)] {
        ip(&["link", "add", end, "type", "veth", "peer", "name", port]);
        ip(&["link", "set", end, "netns", host]);
        ip(&["link", "set", port, "netns", &switch]);
    }
    ip(&["-n", &hosts.a, "addr", "add", "198.18.1.1/24", "dev", &a1]);
    ip(&["-n", &hosts.b, "addr", "add", "198.18.1.2/24", "dev", &b1]);
    ip(&["-n", &switch, "link", "add", &br, "type", "bridge"]);
    for port in [&sa, &sb] {
        ip(&["-n", &switch, "link", "set", port, "master", &br]);
    }
    for (ns, dev, mtu) in [
        (&hosts.a, format!("{}a0", hosts.prefix), "9000"),
        (&hosts.b, format!("{}b0", hosts.prefix), "9000"),
        (&hosts.a, a1.clone(), "9000"),
        (&hosts.b, b1.clone(), "9000"),
        (&switch, sa.clone(), "9000"),
        (&switch, sb.clone(), "1500"),
    ] {
        ip(&["-n", ns, "link", "set", &dev, "mtu", mtu, "up"]);
    }
    ip(&["-n", &switch, "link", "set", &br, "up"]);
    {
        let (_mh, mh) = Node::mh_in_netns(&hosts.a, "198.18.0.1:0");
        let jumbo = (rackwire::vars::LINK_MTU, "8972");
        // Each frame its own packet: a bridge lets a batch handed over with segmentation
        // offload through whole (it looks at each frame only where a NIC would cut it up, which
        // veths do not), where a switch sees every frame on the wire.
        let frames = (rackwire::vars::GSO, "off");
        let env_a =
            [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "198.18.0.1:0,198.18.1.1:0"), jumbo, frames];
        let env_b =
            [(rackwire::vars::TRANSPORT, "edge"), (rackwire::vars::LINKS, "198.18.0.2:0,198.18.1.2:0"), jumbo, frames];
        let mut owner = Node::spawn_in_netns(&hosts.a, &mh, "narrow-owner", &env_a);
        let mut init = Node::spawn_in_netns(&hosts.b, &mh, "narrow-init", &env_b);
        let total: u64 = 8 << 20;
        let a = owner.ok(&format!("alloc {total} rw"));
        let (rid, h) = a.split_once(' ').unwrap();
        owner.ok(&format!("grant {rid} {} rw", init.id));
        assert_eq!(init.ok(&format!("connect {}", owner.id)), "edge");
        init.ok(&format!("stream {h} {total} 262144 20 13"));
        assert_eq!(owner.cmd(&format!("check-pattern {rid} 0 {total} 13")), "ok");
        let stats: serde_json::Value = serde_json::from_str(&init.ok(&format!("stats {}", owner.id))).unwrap();
        assert_eq!(stats["frame_max"], 8972, "{stats}");
        assert_eq!(stats["path_frame_max"], 1452, "{stats}");
        let frames = stats["data_frames"].as_u64().unwrap_or(0);
        assert!(stats["retransmits"].as_u64().unwrap_or(u64::MAX) * 20 < frames, "{stats}");
    }
    let _ = Command::new("ip").args(["netns", "del", &switch]).status();
}
