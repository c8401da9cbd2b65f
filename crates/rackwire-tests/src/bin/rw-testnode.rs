//! A fabric node driven by commands on standard input, one answer line per command on
//! standard output: the tests run several of these as real processes.
//!
//! It joins with the configuration from the environment and prints `ready ID`, or
//! `join-failed KIND MESSAGE` and exits with status 2.

#![deny(unsafe_code)]

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Duration;

use rackwire::{Access, Error, Fabric, FabricConfig, OpFlags, Region, RemoteRegion, Signal};
use rackwire_mh::auth::{from_hex, to_hex};
use rackwire_tests::error_kind;

struct Node {
    fabric: Fabric,
    regions: HashMap<u32, Region>,
    /// Peers' region memory this node kept behind the fabric's back (`keep-dup`), as a
    /// dishonest peer would: by the owner's region id.
    kept: HashMap<u32, rackwire_shm::SharedMem>,
}

/// Open again, for writing, a descriptor this process holds of peer region `rid`'s memory
/// (as a dishonest peer keeps a duplicate), and map it. Needs the power to override file
/// modes (root): the memory's file is owner-read-only.
fn keep_duplicate(rid: u32) -> Result<rackwire_shm::SharedMem, String> {
    let name = format!("/memfd:rackwire-region-{rid} ");
    for e in std::fs::read_dir("/proc/self/fd").map_err(|e| e.to_string())?.flatten() {
        let Ok(link) = std::fs::read_link(e.path()) else { continue };
        if link.to_string_lossy().starts_with(&name) {
            let file = std::fs::OpenOptions::new().read(true).write(true).open(e.path()).map_err(|e| e.to_string())?;
            return rackwire_shm::SharedMem::from_fd(file.into(), rackwire_shm::MapAccess::ReadWrite)
                .map_err(|e| e.to_string());
        }
    }
    Err(format!("no descriptor of region {rid} here"))
}

/// See the `ro-attack` command.
fn attack_read_only(rid: u32) -> String {
    use std::os::fd::AsFd;
    let name = format!("/memfd:rackwire-region-{rid} ");
    let found = std::fs::read_dir("/proc/self/fd")
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().starts_with(&name)));
    let Some(entry) = found else { return format!("none: no descriptor of region {rid} here") };
    let step = |r: Result<(), String>| r.map_or_else(|e| e, |()| "ok".to_string());
    let chmod = std::fs::File::open(entry.path()).map_err(|e| e.to_string()).and_then(|f| {
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(|e| e.to_string())
    });
    let rw = std::fs::OpenOptions::new().read(true).write(true).open(entry.path()).map_err(|e| e.to_string());
    let (mmap, pwrite, punch) = match &rw {
        Ok(f) => (
            step(rackwire_shm::mem::probe_writable_mapping(f.as_fd()).map_err(|e| e.to_string())),
            step(std::os::unix::fs::FileExt::write_at(f, b"EVIL", 0).map(|_| ()).map_err(|e| e.to_string())),
            step(
                rustix::fs::fallocate(
                    f,
                    rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
                    0,
                    4096,
                )
                .map_err(|e| e.to_string()),
            ),
        ),
        Err(e) => (format!("skipped ({e})"), String::new(), String::new()),
    };
    format!(
        "chmod={} reopen={} mmap={mmap} pwrite={pwrite} punch={punch}",
        step(chmod),
        step(rw.as_ref().map(|_| ()).map_err(|e| e.to_string()))
    )
}

fn arg<'a>(a: &[&'a str], i: usize) -> Result<&'a str, String> {
    a.get(i).copied().ok_or_else(|| format!("missing argument {i}"))
}

fn num<T: std::str::FromStr>(a: &[&str], i: usize) -> Result<T, String> {
    arg(a, i)?.parse().map_err(|_| format!("argument {i} is not a number"))
}

fn flags(a: &[&str]) -> OpFlags {
    let mut f = OpFlags::NONE;
    for w in a {
        if let Some(imm) = w.strip_prefix("notify=").and_then(|v| v.parse().ok()) {
            f = f.notify(imm);
        }
        if *w == "fence=before" {
            f = f.fence_before();
        }
        if *w == "fence=after" {
            f = f.fence_after();
        }
    }
    f
}

fn show(r: Result<String, Error>) -> String {
    match r {
        Ok(s) if s.is_empty() => "ok".into(),
        Ok(s) => format!("ok {s}"),
        Err(e) => format!("err {} {e}", error_kind(&e)),
    }
}

impl Node {
    fn handle(&self, a: &[&str]) -> Result<RemoteRegion, String> {
        arg(a, 1)?.parse().map_err(|e: Error| e.to_string())
    }

    fn region(&self, a: &[&str]) -> Result<&Region, String> {
        self.regions.get(&num(a, 1)?).ok_or_else(|| "no such local region".into())
    }

    fn run(&mut self, a: &[&str]) -> Result<String, String> {
        let f = &self.fabric;
        Ok(match a[0] {
            "alloc" | "alloc-served" => {
                let access: Access = arg(a, 2)?.parse().map_err(|e: rackwire::ParseAccessError| e.to_string())?;
                let r = if a[0] == "alloc" { f.alloc(num(a, 1)?, access) } else { f.alloc_served(num(a, 1)?, access) };
                let r = r.map_err(|e| e.to_string())?;
                let s = format!("ok {} {}", r.id(), r.handle());
                self.regions.insert(r.id(), r);
                s
            }
            "free" => {
                self.regions.remove(&num(a, 1)?);
                "ok".into()
            }
            "grant" => {
                let (peer, access) =
                    (num(a, 2)?, arg(a, 3)?.parse().map_err(|e: rackwire::ParseAccessError| e.to_string())?);
                show(self.region(a)?.grant(peer, access).map(|_| String::new()))
            }
            "revoke" => {
                let peer = num(a, 2)?;
                show(self.region(a)?.revoke(peer).map(|o| format!("{o:?}").to_lowercase()))
            }
            "publish" => show(self.region(a)?.publish(arg(a, 2)?).map(|_| String::new())),
            "lookup" => show(f.lookup(arg(a, 1)?).map(|h| h.to_string())),
            "local-read" => {
                let (off, len) = (num(a, 2)?, num(a, 3)?);
                show(self.region(a)?.to_vec(off, len).map(|v| to_hex(&v)))
            }
            "local-load" => {
                let off = num(a, 2)?;
                show(self.region(a)?.load_u64(off).map(|v| v.to_string()))
            }
            "write" => {
                let h = self.handle(a)?;
                let data = from_hex(arg(a, 3)?).ok_or("bad hex")?;
                let off = num(a, 2)?;
                show(
                    f.connect(h.node())
                        .and_then(|c| c.write(&h, off, &data, flags(&a[4..])).wait())
                        .map(|_| String::new()),
                )
            }
            "wsig" => {
                // wsig HANDLE OFF HEX|- SIGOFF set|add VALUE [flags]: write with signal.
                let h = self.handle(a)?;
                let data = match arg(a, 3)? {
                    "-" => Vec::new(),
                    x => from_hex(x).ok_or("bad hex")?,
                };
                let (off, sig_off, v) = (num(a, 2)?, num(a, 4)?, num(a, 6)?);
                let signal = match arg(a, 5)? {
                    "set" => Signal::set(sig_off, v),
                    "add" => Signal::add(sig_off, v),
                    other => return Err(format!("signal `{other}`: set or add")),
                };
                show(
                    f.connect(h.node())
                        .and_then(|c| c.write_signal(&h, off, &data, signal, flags(&a[7..])).wait())
                        .map(|c| c.value().map(|v| v.to_string()).unwrap_or_default()),
                )
            }
            "write-len" => {
                // write LEN bytes of value BYTE: for large or out-of-bounds writes.
                let h = self.handle(a)?;
                let data = vec![num::<u8>(a, 4)?; num::<usize>(a, 3)?];
                let off = num(a, 2)?;
                show(
                    f.connect(h.node())
                        .and_then(|c| c.write(&h, off, &data, flags(&a[5..])).wait())
                        .map(|_| String::new()),
                )
            }
            "read" => {
                let h = self.handle(a)?;
                let (off, len) = (num(a, 2)?, num(a, 3)?);
                show(
                    f.connect(h.node())
                        .and_then(|c| c.read(&h, off, len, OpFlags::NONE).wait())
                        .map(|c| to_hex(&c.into_data())),
                )
            }
            "batch" => {
                let h = self.handle(a)?;
                let mut owned = Vec::new();
                for e in arg(a, 2)?.split(',') {
                    let (off, data) = e.split_once(':').ok_or("entry must be OFF:HEX")?;
                    owned.push((off.parse::<u64>().map_err(|_| "bad offset")?, from_hex(data).ok_or("bad hex")?));
                }
                let entries: Vec<(u64, &[u8])> = owned.iter().map(|(o, d)| (*o, d.as_slice())).collect();
                show(
                    f.connect(h.node())
                        .and_then(|c| c.write_batch(&h, &entries, flags(&a[3..])).wait())
                        .map(|_| String::new()),
                )
            }
            "cas" => {
                let h = self.handle(a)?;
                let (off, exp, new) = (num(a, 2)?, num(a, 3)?, num(a, 4)?);
                let op = f.connect(h.node()).map(|c| c.compare_swap(&h, off, exp, new, OpFlags::NONE));
                show(op.and_then(|o| o.wait()).map(|c| c.value().unwrap_or(0).to_string()))
            }
            "fadd" => {
                let h = self.handle(a)?;
                let (off, add) = (num(a, 2)?, num(a, 3)?);
                show(
                    f.connect(h.node())
                        .and_then(|c| c.fetch_add(&h, off, add, flags(&a[4..])).wait())
                        .map(|c| c.value().unwrap_or(0).to_string()),
                )
            }
            "fadd-loop" => {
                // N fetch-and-adds of 1 on one word.
                let h = self.handle(a)?;
                let c = f.connect(h.node()).map_err(|e| e.to_string())?;
                let (off, n): (u64, u64) = (num(a, 2)?, num(a, 3)?);
                for _ in 0..n {
                    c.fetch_add(&h, off, 1, OpFlags::NONE).wait().map_err(|e| e.to_string())?;
                }
                "ok".into()
            }
            "lock-loop" => {
                // N times: take a compare-and-swap spin lock at LOCK, add 1 to the plain
                // (non-atomic) counter at CTR with a read and a write, release the lock.
                let h = self.handle(a)?;
                let c = f.connect(h.node()).map_err(|e| e.to_string())?;
                let (lock, ctr, n): (u64, u64, u64) = (num(a, 2)?, num(a, 3)?, num(a, 4)?);
                let me = u64::from(f.id());
                let e = |e: Error| e.to_string();
                for _ in 0..n {
                    while c.compare_swap(&h, lock, 0, me, OpFlags::NONE).wait().map_err(e)?.value() != Some(0) {
                        std::hint::spin_loop();
                    }
                    let bytes = c.read(&h, ctr, 8, OpFlags::NONE).wait().map_err(e)?.into_data();
                    let v = u64::from_le_bytes(bytes.try_into().map_err(|_| "short read")?);
                    c.write(&h, ctr, &(v + 1).to_le_bytes(), OpFlags::NONE).wait().map_err(e)?;
                    let old = c.compare_swap(&h, lock, me, 0, OpFlags::NONE).wait().map_err(e)?.value();
                    if old != Some(me) {
                        return Err("lock was not held by us at release".into());
                    }
                }
                "ok".into()
            }
            "send" => {
                let data = from_hex(arg(a, 2)?).ok_or("bad hex")?;
                let node = num(a, 1)?;
                show(f.connect(node).and_then(|c| c.send(&data).wait()).map(|_| String::new()))
            }
            "send-len" => {
                let data = vec![7u8; num(a, 2)?];
                let node = num(a, 1)?;
                show(f.connect(node).and_then(|c| c.send(&data).wait()).map(|_| String::new()))
            }
            "recv" => {
                let ms = num(a, 1)?;
                show(f.recv_timeout(Duration::from_millis(ms)).map(|m| format!("{} {}", m.from, to_hex(&m.data))))
            }
            "notif" => {
                let ms = num(a, 1)?;
                show(
                    f.wait_notification(Duration::from_millis(ms))
                        .map(|n| format!("{} {} {} {} {}", n.from, n.region, n.offset, n.len, n.imm)),
                )
            }
            "connect" => {
                let node = num(a, 1)?;
                show(f.connect(node).map(|c| c.transport().to_string()))
            }
            "keep-dup" => {
                // keep-dup RID: keep region RID's memory behind the fabric's back.
                let rid = num(a, 1)?;
                match keep_duplicate(rid) {
                    Ok(m) => {
                        self.kept.insert(rid, m);
                        "ok".into()
                    }
                    Err(e) => format!("err kept {e}"),
                }
            }
            "ro-attack" => {
                // ro-attack RID: do to this node's read-only descriptor of region RID what a
                // process of the same user can: make the file writable by its owner, reopen it
                // for writing through /proc, then try to write the memory every way the
                // kernel offers. Says how each step went.
                let rid = num(a, 1)?;
                show(Ok(attack_read_only(rid)))
            }
            "dup-write" => {
                let m = self.kept.get(&num(a, 1)?).ok_or("nothing kept")?;
                let data = from_hex(arg(a, 3)?).ok_or("bad hex")?;
                if m.write_at(num(a, 2)?, &data) {
                    "ok".into()
                } else {
                    "err bounds".into()
                }
            }
            "dup-read" => {
                let m = self.kept.get(&num(a, 1)?).ok_or("nothing kept")?;
                let mut buf = vec![0u8; num(a, 3)?];
                if m.read_at(num(a, 2)?, &mut buf) {
                    format!("ok {}", to_hex(&buf))
                } else {
                    "err bounds".into()
                }
            }
            "stats" => {
                let c = f.connect(num(a, 1)?).map_err(|e| e.to_string())?;
                format!("ok {}", serde_json::to_string(&c.stats()).map_err(|e| e.to_string())?)
            }
            "stream" => {
                // stream HANDLE TOTAL CHUNK GAP_MS SEED: write TOTAL bytes of the seeded pattern
                // in CHUNK-byte writes, up to 8 in flight, pausing GAP_MS between writes.
                let h = self.handle(a)?;
                let (total, chunk, gap, seed): (u64, u64, u64, u64) = (num(a, 2)?, num(a, 3)?, num(a, 4)?, num(a, 5)?);
                let c = f.connect(h.node()).map_err(|e| e.to_string())?;
                let mut flight = std::collections::VecDeque::new();
                let mut off = 0;
                let t0 = std::time::Instant::now();
                while off < total {
                    let n = chunk.min(total - off);
                    let data = rackwire_tests::pattern(seed, off, n as usize);
                    if flight.len() == 8 {
                        let op: rackwire::Op = flight.pop_front().expect("full");
                        op.wait().map_err(|e| e.to_string())?;
                    }
                    flight.push_back(c.write(&h, off, &data, OpFlags::NONE));
                    off += n;
                    std::thread::sleep(Duration::from_millis(gap));
                }
                for op in flight {
                    op.wait().map_err(|e| e.to_string())?;
                }
                format!("ok {}", t0.elapsed().as_millis())
            }
            "check-pattern" => {
                // check-pattern REGION OFF LEN SEED: the region holds the seeded pattern there.
                let (off, len, seed): (u64, usize, u64) = (num(a, 2)?, num(a, 3)?, num(a, 4)?);
                let got = self.region(a)?.to_vec(off, len).map_err(|e| e.to_string())?;
                let want = rackwire_tests::pattern(seed, off, len);
                match got.iter().zip(&want).position(|(x, y)| x != y) {
                    None => "ok".into(),
                    Some(i) => format!("err mismatch at byte {}", off + i as u64),
                }
            }
            other => return Err(format!("unknown command {other}")),
        })
    }
}

/// `rw-testnode mh ADDR`: a management host (for tests whose nodes live in namespaces the
/// test process cannot bind in). Prints `listening ADDR`, runs until standard input closes.
fn run_mh(addr: &str) {
    let secret = std::env::var(rackwire::vars::SECRET).unwrap_or_default();
    match rackwire::ManagementHost::start(addr, None, secret.as_bytes()) {
        Ok(h) => {
            println!("listening {}", h.addr());
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
            h.stop();
        }
        Err(e) => {
            println!("mh-failed {e}");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("mh") {
        run_mh(args.get(2).map_or("127.0.0.1:0", String::as_str));
        return;
    }
    let joined = FabricConfig::from_env().and_then(|mut c| {
        c.op_timeout = Duration::from_secs(5);
        Fabric::join(c)
    });
    let fabric = match joined {
        Ok(f) => f,
        Err(e) => {
            println!("join-failed {} {e}", error_kind(&e));
            std::process::exit(2);
        }
    };
    println!("ready {}", fabric.id());
    let mut node = Node { fabric, regions: HashMap::new(), kept: HashMap::new() };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() {
            continue;
        }
        if words[0] == "quit" {
            break;
        }
        let answer = node.run(&words).unwrap_or_else(|e| format!("bad-command {e}"));
        let _ = writeln!(out, "{answer}");
        let _ = out.flush();
    }
}
