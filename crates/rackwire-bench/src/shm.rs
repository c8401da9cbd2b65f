//! The shared-memory benchmarks: an initiator (this process) and a responder (a child process
//! of the same executable), joined through an embedded management host.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use rackwire::{
    Access, BatchOptions, Bytes, Cmp, Conn, Fabric, FabricConfig, ManagementHost, OpFlags, RemoteRegion, Signal,
    MESSAGE_BYTES_MAX,
};
use serde::{Deserialize, Serialize};

use crate::report::{Report, Row};
use crate::stats::{iterations, pingpong_iters, timed_pingpong, Meter};
use crate::{limit, peers, Pattern};

/// How long either side waits for the other before it gives up on a benchmark.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// Requests in Marlin's Table 1 experiment, and their size.
const TABLE1_REQUESTS: u64 = 10_000;
const TABLE1_REQUEST_BYTES: u64 = 4096;
/// Requests per batch in Table 1's batched configurations.
const TABLE1_BATCH: u64 = 256;
/// Marlin's Fig. 6: pieces in its one scatter-gather write, and their sizes.
const PIECES: usize = 2_000;
const PIECE_SIZES: [usize; 10] = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536];
/// The pieces land (and are read from) within this window, over again where they pass its end.
const PIECES_WINDOW: usize = 32 << 20;
/// How long the responder polls before it sleeps on its doorbell.
const RESPONDER_BUSY_POLL: Duration = Duration::from_millis(20);
/// Rounds of a one-way measurement (the median round is reported).
const ONEWAY_ROUNDS: u64 = 5;
/// Region size floor: Table 1 writes 40 MB of distinct pages.
const REGION_BYTES_MIN: u64 = 48 << 20;

/// Which transport a benchmark measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchTransport {
    /// Shared memory between two processes.
    Shm,
    /// The edge transport over `links` loopback UDP links with frames of `mtu` bytes.
    Udp {
        /// Links.
        links: usize,
        /// Largest frame.
        mtu: usize,
        /// Frames sealed (the default); unsealed only to measure what sealing costs.
        sealed: bool,
    },
    /// The edge transport between two hosts of a virtual rack, over their rails (see
    /// [`crate::rails`]).
    Rails,
}

impl BenchTransport {
    /// Its name in rows.
    pub fn name(self) -> &'static str {
        match self {
            BenchTransport::Shm => "shm",
            BenchTransport::Udp { sealed: true, .. } => "udp",
            BenchTransport::Udp { sealed: false, .. } => "udp-unsealed",
            BenchTransport::Rails => "rails",
        }
    }
}

/// What to measure.
#[derive(Clone, Debug)]
pub struct ShmBench {
    /// Transport.
    pub transport: BenchTransport,
    /// Patterns, in order.
    pub patterns: Vec<Pattern>,
    /// Sizes in bytes.
    pub sizes: Vec<u64>,
    /// Add memcpy rows for the same sizes.
    pub with_limit: bool,
    /// Add UCX rows where `ucx_perftest` is installed.
    pub peers: bool,
    /// Scale of the iteration budget (1.0 = full; the demo uses less).
    pub scale: f64,
    /// Show a progress bar on a terminal.
    pub progress: bool,
    /// The executable that has the responder subcommand (default: this one).
    pub responder_exe: Option<PathBuf>,
    /// Copy channels of the initiator node.
    pub copy_channels: usize,
}

impl Default for ShmBench {
    fn default() -> Self {
        ShmBench {
            transport: BenchTransport::Shm,
            patterns: vec![Pattern::Pingpong, Pattern::Oneway],
            sizes: vec![8, 4096, 65536, 1 << 20],
            with_limit: false,
            peers: false,
            scale: 1.0,
            progress: true,
            responder_exe: None,
            copy_channels: 2,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
enum Cmd {
    Hello,
    Ready,
    Pingpong {
        size: u64,
        iters: u64,
    },
    /// Ping-pong through pins: data, then a signal word set to `base + i` (see
    /// [`Session::pingpong_pinned`]).
    PingpongPinned {
        size: u64,
        iters: u64,
        base: u64,
    },
    Oneway {
        size: u64,
    },
    Twoway {
        size: u64,
        iters: u64,
    },
    Rate {
        size: u64,
        iters: u64,
    },
    Done,
    Stats,
    StatsReply {
        stats: NetCounters,
    },
    Quit,
}

/// The edge counters that go into a row, from one side.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
struct NetCounters {
    data_frames: u64,
    retransmits: u64,
    frames_received: u64,
    out_of_order: u64,
}

impl NetCounters {
    fn of(c: &Conn) -> Self {
        let s = c.stats().edge_or_zero();
        NetCounters {
            data_frames: s.data_frames,
            retransmits: s.retransmits,
            frames_received: s.frames_received,
            out_of_order: s.out_of_order,
        }
    }
    fn minus(self, o: Self) -> Self {
        NetCounters {
            data_frames: self.data_frames - o.data_frames,
            retransmits: self.retransmits - o.retransmits,
            frames_received: self.frames_received - o.frames_received,
            out_of_order: self.out_of_order - o.out_of_order,
        }
    }
    fn plus(self, o: Self) -> Self {
        NetCounters {
            data_frames: self.data_frames + o.data_frames,
            retransmits: self.retransmits + o.retransmits,
            frames_received: self.frames_received + o.frames_received,
            out_of_order: self.out_of_order + o.out_of_order,
        }
    }
}

fn send_cmd(c: &Conn, cmd: &Cmd) -> Result<()> {
    c.send(&serde_json::to_vec(cmd)?).wait()?;
    Ok(())
}

fn recv_cmd(c: &Conn) -> Result<Cmd> {
    let m = c.recv_timeout(STEP_TIMEOUT).context("waiting for the other side")?;
    serde_json::from_slice(&m).map_err(|e| anyhow!("bad control message: {e}"))
}

fn expect(c: &Conn, want: &str) -> Result<()> {
    let got = recv_cmd(c)?;
    let name = serde_json::to_value(&got)?.get("cmd").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    if name != want {
        bail!("expected {want}, got {got:?}");
    }
    Ok(())
}

fn bench_config(
    mh: &str,
    secret: &str,
    name: &str,
    channels: usize,
    transport: BenchTransport,
) -> Result<FabricConfig> {
    let mut c = match transport {
        BenchTransport::Rails => crate::rails::config(name)?,
        _ => FabricConfig::new(mh, secret, name),
    };
    if let BenchTransport::Udp { links, mtu, sealed } = transport {
        c.transport = rackwire::TransportChoice::Edge;
        c.links = vec!["127.0.0.1:0".into(); links];
        c.link_mtu = mtu;
        c.seal_frames = sealed;
    }
    // Both sides poll: this is a latency benchmark, and each has a core. Not between a rack's
    // hosts: there each host has one core for its application and network threads, and a wait
    // that polls for long keeps the network thread from answering its peer's probes (links
    // then go down); the library's own setting, or RACKWIRE_BUSY_POLL_US, holds there.
    if transport != BenchTransport::Rails {
        c.busy_poll = Duration::from_secs(1);
    }
    c.copy_channels = channels;
    c.op_timeout = STEP_TIMEOUT;
    Ok(c)
}

/// Where the pinned ping-pong puts its data and its signal word in a region of `len` bytes:
/// at the end, clear of every other pattern's writes (at offset 0, at most half the region).
fn pinned_layout(len: u64, size: u64) -> (u64, u64) {
    let signal = (len - 8) & !7;
    (signal - size, signal)
}

fn region_bytes(sizes: &[u64]) -> u64 {
    sizes.iter().copied().max().unwrap_or(0).saturating_mul(2).max(REGION_BYTES_MIN)
}

/// The responder: started by the initiator with its parameters in the environment.
pub fn responder_main() -> Result<()> {
    let var = |k: &str| {
        std::env::var(k).with_context(|| format!("{k} not set (the responder is started by `rackwire bench`)"))
    };
    let links = std::env::var("RW_BENCH_LINKS").unwrap_or_default();
    let transport = match links.parse::<usize>().ok() {
        _ if links == "rails" => BenchTransport::Rails,
        Some(links) if links > 0 => BenchTransport::Udp {
            links,
            mtu: var("RW_BENCH_MTU")?.parse()?,
            sealed: std::env::var("RW_BENCH_SEAL").map_or(true, |v| v != "off"),
        },
        _ => BenchTransport::Shm,
    };
    let (mh, secret) = match transport {
        // The rack's, from the host's environment (a secret file, not a value).
        BenchTransport::Rails => (String::new(), String::new()),
        _ => (var(rackwire::vars::MH)?, var(rackwire::vars::SECRET)?),
    };
    let mut cfg = bench_config(&mh, &secret, &var(rackwire::vars::NAME)?, 1, transport)?;
    // Poll through the short gaps of ping-pong, but sleep when the initiator works alone
    // (Table 1, large batches), so its copy channels have the other core.
    if transport != BenchTransport::Rails {
        cfg.busy_poll = RESPONDER_BUSY_POLL;
    }
    let initiator: u32 = var("RW_BENCH_INITIATOR")?.parse()?;
    let bytes: u64 = var("RW_BENCH_REGION")?.parse()?;
    let fabric = Fabric::join(cfg)?;
    let region = fabric.alloc(bytes, Access::ALL)?;
    region.grant(initiator, Access::ALL)?;
    region.publish(&format!("bench/{initiator}/responder"))?;
    let conn = fabric.connect(initiator)?;
    let target = fabric.lookup(&format!("bench/{initiator}/initiator"))?;
    send_cmd(&conn, &Cmd::Hello)?;
    let buf = Bytes::from(vec![0x5au8; bytes as usize / 2]);
    loop {
        match recv_cmd(&conn)? {
            Cmd::Pingpong { size, iters } => {
                for _ in 0..iters {
                    let n = fabric.wait_notification(STEP_TIMEOUT)?;
                    conn.write_bytes(&target, 0, buf.slice(..size as usize), OpFlags::NONE.notify(n.imm)).wait()?;
                }
            }
            Cmd::PingpongPinned { size, iters, base } => {
                let mut pin = conn.pin(&target, Access::WRITE)?;
                let (data, signal) = pinned_layout(bytes, size);
                for i in 1..=iters {
                    region.wait_u64(signal, Cmp::Ge, base + i, STEP_TIMEOUT)?;
                    pin.write_signal(data, &buf[..size as usize], Signal::set(signal, base + i))?;
                }
            }
            Cmd::Oneway { .. } => {
                send_cmd(&conn, &Cmd::Ready)?;
                let n = fabric.wait_notification(STEP_TIMEOUT)?;
                conn.write(&target, 0, &buf[..8], OpFlags::NONE.notify(n.imm)).wait()?;
            }
            Cmd::Twoway { size, iters } => {
                send_cmd(&conn, &Cmd::Ready)?;
                stream_writes(&conn, &target, &buf.slice(..size as usize), iters)?;
                fabric.wait_notification(STEP_TIMEOUT)?;
            }
            Cmd::Rate { iters, .. } => {
                send_cmd(&conn, &Cmd::Ready)?;
                for _ in 0..iters {
                    conn.recv_timeout(STEP_TIMEOUT)?;
                }
                send_cmd(&conn, &Cmd::Done)?;
            }
            Cmd::Stats => send_cmd(&conn, &Cmd::StatsReply { stats: NetCounters::of(&conn) })?,
            Cmd::Quit => return Ok(()),
            other => bail!("unexpected command {other:?}"),
        }
    }
}

/// Writes a stream keeps in flight (shared-memory writes complete at once; network writes
/// are pipelined up to this many).
const STREAM_OPS_IN_FLIGHT: usize = 32;

/// `iters` writes of `data` at offset 0, the last one notifying.
/// The data goes as [`Bytes`], which the edge transport sends without copying (the shared-
/// memory transport copies it into the target either way).
fn stream_writes(conn: &Conn, target: &RemoteRegion, data: &Bytes, iters: u64) -> Result<()> {
    let mut flight = std::collections::VecDeque::with_capacity(STREAM_OPS_IN_FLIGHT);
    for i in 0..iters {
        let flags = if i + 1 == iters { OpFlags::NONE.notify(i).fence_before() } else { OpFlags::NONE };
        if flight.len() == STREAM_OPS_IN_FLIGHT {
            let op: rackwire::Op = flight.pop_front().expect("full");
            op.wait()?;
        }
        flight.push_back(conn.write_bytes(target, 0, data.clone(), flags));
    }
    for op in flight {
        op.wait()?;
    }
    Ok(())
}

/// One way of carrying out Table 1's writes.
type Table1Run<'a> = Box<dyn Fn() -> Result<()> + 'a>;

struct Session {
    fabric: Fabric,
    conn: Conn,
    target: RemoteRegion,
    child: Child,
    buf: Vec<u8>,
    channels: usize,
    transport: BenchTransport,
    /// The next pinned ping-pong's first signal (see [`Session::pingpong_pinned`]).
    signal_base: std::sync::atomic::AtomicU64,
    // Dropped in this order: the region is freed while the management host still runs.
    region: rackwire::Region,
    /// This benchmark's own management host (none over a rack's rails: the rack's).
    _mh: Option<rackwire::MhHandle>,
}

impl Session {
    fn start(cfg: &ShmBench) -> Result<Session> {
        let secret = format!("{:032x}", rackwire_mh::auth::random_u128());
        let mh = match cfg.transport {
            BenchTransport::Rails => None,
            _ => Some(ManagementHost::start("127.0.0.1:0", None, secret.as_bytes())?),
        };
        let addr = mh.as_ref().map(|m| m.addr().to_string()).unwrap_or_default();
        let pid = std::process::id();
        let fabric = Fabric::join(bench_config(
            &addr,
            &secret,
            &format!("bench-initiator-{pid}"),
            cfg.copy_channels,
            cfg.transport,
        )?)?;
        let bytes = region_bytes(&cfg.sizes);
        let region = fabric.alloc(bytes, Access::ALL)?;
        region.publish(&format!("bench/{}/initiator", fabric.id()))?;
        let exe = match &cfg.responder_exe {
            Some(p) => p.clone(),
            None => crate::spawn::own_exe()?,
        };
        let (links, mtu, sealed) = match cfg.transport {
            BenchTransport::Udp { links, mtu, sealed } => (links.to_string(), mtu, sealed),
            BenchTransport::Shm => ("0".into(), 0, true),
            BenchTransport::Rails => ("rails".into(), 0, true),
        };
        let mut responder = match cfg.transport {
            BenchTransport::Rails => crate::rails::responder_command(&exe, crate::spawn::RESPONDER)?,
            _ => {
                let mut c = Command::new(exe);
                c.arg(crate::spawn::RESPONDER).env(rackwire::vars::MH, &addr).env(rackwire::vars::SECRET, &secret);
                c
            }
        };
        let child = responder
            .env("RW_BENCH_LINKS", links)
            .env("RW_BENCH_MTU", mtu.to_string())
            .env("RW_BENCH_SEAL", if sealed { "on" } else { "off" })
            .env(rackwire::vars::NAME, format!("bench-responder-{pid}"))
            .env("RW_BENCH_INITIATOR", fabric.id().to_string())
            .env("RW_BENCH_REGION", bytes.to_string())
            .stdin(Stdio::null())
            .spawn()
            .context("starting the responder process")?;
        let hello = fabric.recv_timeout(Duration::from_secs(30)).context("the responder did not come up")?;
        region.grant(hello.from, Access::ALL)?;
        let conn = fabric.connect(hello.from)?;
        let target = fabric.lookup(&format!("bench/{}/responder", fabric.id()))?;
        let buf: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
        Ok(Session {
            fabric,
            conn,
            target,
            child,
            buf,
            channels: cfg.copy_channels,
            transport: cfg.transport,
            signal_base: std::sync::atomic::AtomicU64::new(0),
            region,
            _mh: mh,
        })
    }

    fn pingpong(&self, size: u64, scale: f64) -> Result<Row> {
        let (iters, warm) = pingpong_iters(size, scale);
        send_cmd(&self.conn, &Cmd::Pingpong { size, iters: iters + warm })?;
        let data = Bytes::copy_from_slice(&self.buf[..size as usize]);
        timed_pingpong(self.transport.name(), size, iters, warm, |i| {
            self.conn.write_bytes(&self.target, 0, data.clone(), OpFlags::NONE.notify(i)).wait()?;
            let n = self.fabric.wait_notification(STEP_TIMEOUT)?;
            if n.imm != i {
                bail!("ping-pong out of step: sent {i}, got {}", n.imm);
            }
            Ok(())
        })
    }

    /// Ping-pong through pins ([`rackwire::Conn::pin`], shared memory only): each side stores
    /// the data and then a signal word into the other's region ([`rackwire::Pinned::write_signal`])
    /// and waits for its own word ([`rackwire::Region::wait_u64`]) — OpenSHMEM's
    /// `put_signal` and `signal_wait_until`, and what `ucx_perftest -t ucp_put_lat` measures.
    /// The signal counts up across runs (`base`), so a word left from an earlier run never
    /// satisfies a wait.
    fn pingpong_pinned(&self, size: u64, scale: f64) -> Result<Row> {
        let (iters, warm) = pingpong_iters(size, scale);
        let base = self.signal_base.fetch_add(iters + warm, std::sync::atomic::Ordering::Relaxed);
        let mut pin = self.conn.pin(&self.target, Access::WRITE)?;
        send_cmd(&self.conn, &Cmd::PingpongPinned { size, iters: iters + warm, base })?;
        let (data, signal) = pinned_layout(self.region.len(), size);
        let payload = &self.buf[..size as usize];
        timed_pingpong("shm-pinned", size, iters, warm, |i| {
            pin.write_signal(data, payload, Signal::set(signal, base + i + 1))?;
            self.region.wait_u64(signal, Cmp::Ge, base + i + 1, STEP_TIMEOUT)?;
            Ok(())
        })
    }

    /// One-way stream of writes, in [`ONEWAY_ROUNDS`] rounds; with `limit`, each round is
    /// followed by a memcpy round of the same size and count, so both face the same machine.
    /// Over shared memory each round is also run through a pin of the target
    /// ([`rackwire::Conn::pin`]: each write its stores alone, no handle), as the
    /// `shm-pinned` row. Each row reports its median round.
    fn oneway(&self, size: u64, scale: f64, limit: bool) -> Result<(Row, Option<Row>, Option<Row>)> {
        let iters = iterations((4e9 * scale) as u64, size, 100, 1_000_000);
        let per = (iters / ONEWAY_ROUNDS).max(20);
        let data = Bytes::copy_from_slice(&self.buf[..size as usize]);
        // Warm the mapping and the pages.
        for _ in 0..(per / 2).max(1) {
            self.conn.write_bytes(&self.target, 0, data.clone(), OpFlags::NONE).wait()?;
        }
        let mut pin = match self.transport {
            BenchTransport::Shm => Some(self.conn.pin(&self.target, Access::WRITE)?),
            BenchTransport::Udp { .. } | BenchTransport::Rails => None,
        };
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        let mut pinned = Vec::new();
        for _ in 0..ONEWAY_ROUNDS {
            send_cmd(&self.conn, &Cmd::Oneway { size })?;
            expect(&self.conn, "ready")?;
            let m = Meter::start();
            stream_writes(&self.conn, &self.target, &data, per)?;
            self.fabric.wait_notification(STEP_TIMEOUT)?;
            let (wall, cpu) = m.stop();
            ours.push(stream_row("oneway", size, per, size * per, wall, cpu));
            if let Some(pin) = pin.as_mut() {
                send_cmd(&self.conn, &Cmd::Oneway { size })?;
                expect(&self.conn, "ready")?;
                let m = Meter::start();
                for _ in 1..per {
                    pin.write(0, &data)?;
                }
                // The last write tells the responder the round is over, behind the others.
                self.conn.write(&self.target, 0, &data, OpFlags::NONE.notify(per).fence_before()).wait()?;
                self.fabric.wait_notification(STEP_TIMEOUT)?;
                let (wall, cpu) = m.stop();
                let mut row = stream_row("oneway", size, per, size * per, wall, cpu);
                row.transport = "shm-pinned".into();
                pinned.push(row);
            }
            if limit {
                theirs.push(limit::memcpy_row(&self.buf, size, per));
            }
        }
        let n = per * ONEWAY_ROUNDS;
        let median = |rows: Vec<Row>| (!rows.is_empty()).then(|| median_round(rows, n));
        Ok((median_round(ours, n), median(theirs), median(pinned)))
    }

    fn twoway(&self, size: u64, scale: f64) -> Result<Row> {
        let iters = iterations((2e9 * scale) as u64, size, 100, 500_000);
        send_cmd(&self.conn, &Cmd::Twoway { size, iters })?;
        expect(&self.conn, "ready")?;
        let m = Meter::start();
        stream_writes(&self.conn, &self.target, &Bytes::copy_from_slice(&self.buf[..size as usize]), iters)?;
        self.fabric.wait_notification(STEP_TIMEOUT)?;
        let (wall, cpu) = m.stop();
        Ok(stream_row("twoway", size, iters, 2 * size * iters, wall, cpu))
    }

    fn rate(&self, size: u64, scale: f64) -> Result<Row> {
        let iters = iterations((1e9 * scale) as u64, size, 1000, (1_000_000.0 * scale).max(10_000.0) as u64);
        send_cmd(&self.conn, &Cmd::Rate { size, iters })?;
        expect(&self.conn, "ready")?;
        let data = &self.buf[..size as usize];
        let m = Meter::start();
        for _ in 0..iters {
            self.conn.send(data).wait()?;
        }
        expect(&self.conn, "done")?;
        let (wall, cpu) = m.stop();
        Ok(stream_row("rate", size, iters, size * iters, wall, cpu))
    }

    /// Marlin's Table 1, in software: 10,000 writes of 4 KiB.
    fn table1(&self) -> Result<Vec<Row>> {
        let src = &self.buf[..(TABLE1_REQUESTS * TABLE1_REQUEST_BYTES) as usize];
        let page = TABLE1_REQUEST_BYTES as usize;
        let entries: Vec<(u64, &[u8])> = src.chunks(page).enumerate().map(|(i, c)| ((i * page) as u64, c)).collect();
        let channels = self.channels.max(1);
        // 40 scatter-gather writes of 256 pages each, with or without combining.
        let batches = |combine: bool| -> Result<()> {
            for b in entries.chunks(TABLE1_BATCH as usize) {
                self.conn
                    .write_batch_with(&self.target, b, OpFlags::NONE, BatchOptions { combine, channels: 0 })
                    .wait()?;
            }
            Ok(())
        };
        let variants: [(&str, Table1Run<'_>); 4] = [
            (
                "baseline",
                Box::new(|| {
                    for (off, d) in &entries {
                        self.conn.write(&self.target, *off, d, OpFlags::NONE).wait()?;
                    }
                    Ok(())
                }),
            ),
            (
                "multi-channel",
                Box::new(|| {
                    let per = entries.len().div_ceil(channels);
                    std::thread::scope(|s| {
                        let hs: Vec<_> = entries
                            .chunks(per)
                            .map(|part| {
                                s.spawn(move || -> Result<()> {
                                    for (off, d) in part {
                                        self.conn.write(&self.target, *off, d, OpFlags::NONE).wait()?;
                                    }
                                    Ok(())
                                })
                            })
                            .collect();
                        hs.into_iter().try_for_each(|h| h.join().map_err(|_| anyhow!("channel thread panicked"))?)
                    })
                }),
            ),
            ("batched", Box::new(|| batches(false))),
            ("combined", Box::new(|| batches(true))),
        ];
        const ROUNDS: u32 = 5;
        let mut rows = Vec::new();
        for (name, run) in &variants {
            run()?;
            let m = Meter::start();
            for _ in 0..ROUNDS {
                run()?;
            }
            let (wall, cpu) = m.stop();
            let ops = TABLE1_REQUESTS * u64::from(ROUNDS);
            let mut row = stream_row("table1", TABLE1_REQUEST_BYTES, ops, ops * TABLE1_REQUEST_BYTES, wall, cpu);
            row.variant = Some((*name).into());
            rows.push(row);
        }
        Ok(rows)
    }

    /// Marlin's Fig. 6, in software: one scatter-gather write (a batch, nothing combined) of
    /// [`PIECES`] pieces of one size, for each of [`PIECE_SIZES`]; the median of five rounds.
    fn pieces(&self) -> Result<Vec<Row>> {
        const ROUNDS: usize = 5;
        let window = PIECES_WINDOW.min(self.buf.len()).min(self.target.len() as usize);
        let mut rows = Vec::new();
        for size in PIECE_SIZES {
            let entries: Vec<(u64, &[u8])> = (0..PIECES)
                .map(|i| {
                    let at = (i * size) % (window - window % size);
                    (at as u64, &self.buf[at..at + size])
                })
                .collect();
            let opts = BatchOptions { combine: false, channels: 0 };
            self.conn.write_batch_with(&self.target, &entries, OpFlags::NONE, opts).wait()?;
            let mut runs = Vec::with_capacity(ROUNDS);
            for _ in 0..ROUNDS {
                let m = Meter::start();
                self.conn.write_batch_with(&self.target, &entries, OpFlags::NONE, opts).wait()?;
                runs.push(m.stop());
            }
            runs.sort_by_key(|(wall, _)| *wall);
            let (wall, cpu) = runs[ROUNDS / 2];
            let bytes = (PIECES * size) as u64;
            rows.push(stream_row("pieces", size as u64, PIECES as u64, bytes, wall, cpu));
        }
        Ok(rows)
    }

    /// Both sides' edge counters added up (zero on shared memory).
    fn net(&self) -> Result<NetCounters> {
        if self.transport == BenchTransport::Shm {
            return Ok(NetCounters::default());
        }
        send_cmd(&self.conn, &Cmd::Stats)?;
        match recv_cmd(&self.conn)? {
            Cmd::StatsReply { stats } => Ok(NetCounters::of(&self.conn).plus(stats)),
            other => bail!("expected stats, got {other:?}"),
        }
    }

    fn finish(mut self) {
        let _ = send_cmd(&self.conn, &Cmd::Quit);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The row of the round with the median throughput, counted over all `iters` of the rounds.
fn median_round(mut rounds: Vec<Row>, iters: u64) -> Row {
    rounds.sort_by(|a, b| a.mb_per_s.partial_cmp(&b.mb_per_s).unwrap_or(std::cmp::Ordering::Equal));
    let mut r = rounds.swap_remove(rounds.len() / 2);
    r.iters = iters;
    r
}

fn stream_row(pattern: &str, size: u64, iters: u64, bytes: u64, wall: Duration, cpu: f64) -> Row {
    let secs = wall.as_secs_f64();
    Row {
        transport: "shm".into(),
        pattern: pattern.into(),
        size,
        iters,
        lat_us_avg: Some(secs * 1e6 / iters as f64),
        mb_per_s: Some(bytes as f64 / secs / 1e6),
        msgs_per_s: Some(iters as f64 / secs),
        cpu_pct: Some(cpu),
        ..Row::default()
    }
}

/// Run the shared-memory benchmarks as configured.
pub fn run_shm(cfg: &ShmBench) -> Result<Report> {
    let mut report = Report::default();
    report.meta.insert("transport".into(), cfg.transport.name().into());
    report.meta.insert("cores".into(), std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).into());
    report.meta.insert("copy_channels".into(), cfg.copy_channels.into());
    let steps: u64 = cfg
        .patterns
        .iter()
        .map(|p| if matches!(p, Pattern::Table1 | Pattern::Pieces) { 1 } else { cfg.sizes.len() as u64 })
        .sum::<u64>()
        + if cfg.with_limit && !cfg.patterns.contains(&Pattern::Oneway) { cfg.sizes.len() as u64 } else { 0 };
    let bar = if cfg.progress { ProgressBar::new(steps) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    let s = Session::start(cfg)?;
    let mut limit_sizes = cfg.sizes.clone();
    let result = (|| -> Result<()> {
        for &p in &cfg.patterns {
            if matches!(p, Pattern::Table1 | Pattern::Pieces) {
                if s.transport != BenchTransport::Shm {
                    report.notes.push(format!("{} measures the shared-memory copy; skipped for udp", p.name()));
                } else {
                    bar.set_message(p.name());
                    report.rows.extend(if p == Pattern::Table1 { s.table1()? } else { s.pieces()? });
                }
                bar.inc(1);
                continue;
            }
            for &size in &cfg.sizes {
                bar.set_message(format!("{} {}", p.name(), crate::show_size(size)));
                let before = s.net()?;
                let row = match p {
                    Pattern::Pingpong => {
                        if s.transport == BenchTransport::Shm {
                            report.rows.push(s.pingpong_pinned(size, cfg.scale)?);
                        }
                        s.pingpong(size, cfg.scale)?
                    }
                    Pattern::Oneway => {
                        let (row, memcpy, pinned) = s.oneway(size, cfg.scale, cfg.with_limit)?;
                        report.rows.extend(pinned);
                        if let Some(m) = memcpy {
                            report.rows.push(row);
                            limit_sizes.retain(|&x| x != size);
                            m
                        } else {
                            row
                        }
                    }
                    Pattern::Twoway => s.twoway(size, cfg.scale)?,
                    Pattern::Rate if size as usize > MESSAGE_BYTES_MAX => {
                        report.notes.push(format!(
                            "rate at {} skipped: messages are at most {MESSAGE_BYTES_MAX} bytes",
                            crate::show_size(size)
                        ));
                        bar.inc(1);
                        continue;
                    }
                    Pattern::Rate => s.rate(size, cfg.scale)?,
                    Pattern::Table1 | Pattern::Pieces => unreachable!("handled above"),
                };
                let mut row = row;
                if s.transport != BenchTransport::Shm {
                    let d = s.net()?.minus(before);
                    let sent = d.data_frames + d.retransmits;
                    row.retransmits = Some(d.retransmits);
                    row.extra_pct = Some(if sent == 0 { 0.0 } else { 100.0 * d.retransmits as f64 / sent as f64 });
                    row.out_of_order_pct = Some(if d.frames_received == 0 {
                        0.0
                    } else {
                        100.0 * d.out_of_order as f64 / d.frames_received as f64
                    });
                }
                report.rows.push(row);
                bar.inc(1);
            }
        }
        Ok(())
    })();
    for r in report.rows.iter_mut().filter(|r| r.transport == "shm") {
        r.transport = cfg.transport.name().into();
    }
    s.finish();
    result?;
    if cfg.with_limit {
        let src: Vec<u8> = (0..cfg.sizes.iter().copied().max().unwrap_or(1)).map(|i| i as u8).collect();
        for size in limit_sizes {
            bar.set_message(format!("memcpy {}", crate::show_size(size)));
            report.rows.push(limit::memcpy_row(&src, size, limit::default_iterations(size)));
            bar.inc(1);
        }
        // The limits of the small-operation rows, measured once the benchmark's own processes
        // are done: a bare cache-line ping-pong between two cores beside the ping-pong rows,
        // plain stores into a shared mapping beside the one-way rows.
        if cfg.patterns.contains(&Pattern::Pingpong) {
            bar.set_message("cacheline");
            report.rows.push(limit::cacheline_row(cfg.scale));
        }
        if cfg.patterns.contains(&Pattern::Oneway) {
            for &size in cfg.sizes.iter().filter(|&&s| s <= limit::STORE_SIZE_MAX) {
                bar.set_message(format!("store {}", crate::show_size(size)));
                match limit::store_row(size, cfg.scale) {
                    Some(r) => report.rows.push(r),
                    None => report.notes.push("store rows skipped: no shared mapping".into()),
                }
            }
        }
    }
    bar.finish_and_clear();
    if cfg.peers {
        match cfg.transport {
            BenchTransport::Shm => {
                peers::ucx_rows("posix,self", "ucx-posix", &cfg.patterns, &cfg.sizes, cfg.scale, &mut report)
            }
            BenchTransport::Udp { .. } => peers::network_rows(&cfg.patterns, &cfg.sizes, cfg.scale, &mut report),
            BenchTransport::Rails => report.notes.push("no peer rows over a rack's rails".into()),
        }
    }
    Ok(report)
}
