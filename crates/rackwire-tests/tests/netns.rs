//! Two hosts in network namespaces, joined by two veth links (addresses from 198.18.0.0/15),
//! talking over the edge transport; one link really goes down (`ip link set down`) in the
//! middle of a stream. Needs root; skips with a message otherwise. The namespaces are removed
//! afterwards, also when the test fails.

use std::process::Command;
use std::time::Duration;

use rackwire_tests::{hex, Node};

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Two namespaces `a` and `b` with links `a0`–`b0` (198.18.0.0/24) and `a1`–`b1` (198.18.1.0/24).
struct Hosts {
    a: String,
    b: String,
    prefix: String,
}

impl Hosts {
    fn up() -> Hosts {
        let p = format!("rwt{}", std::process::id() % 100_000);
        // Leftovers of an earlier run that crashed (its process is gone) go first.
        if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                let pid = name.strip_prefix("rwt").map(|r| r.trim_end_matches(['a', 'b']));
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
        ip(&["-n", &self.a, "link", "set", &format!("{}a{k}", self.prefix), "down"]);
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
    let hosts = Hosts::up();
    let names = (hosts.a.clone(), hosts.b.clone());
    {
        let (_mh, mh) = Node::mh_in_netns(&hosts.a, "198.18.0.1:0");
        let jumbo = ("RACKWIRE_LINK_MTU", "8972");
        let env_a = [("RACKWIRE_TRANSPORT", "edge"), ("RACKWIRE_LINKS", "198.18.0.1:0,198.18.1.1:0"), jumbo];
        let env_b = [("RACKWIRE_TRANSPORT", "edge"), ("RACKWIRE_LINKS", "198.18.0.2:0,198.18.1.2:0"), jumbo];
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
