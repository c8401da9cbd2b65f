//! `rackwire bench ofi`: libfabric's own ping-pong (`fi_pingpong`, Debian's libfabric-bin)
//! between two processes over the `rackwire` provider and over libfabric's own providers,
//! each as its users run it (`-e rdm`, tagged messages, the provider picked with `-p`, nothing
//! else tuned), in the same run, the providers' order rotated every repeat. On this machine:
//! against `shm`, `tcp` and `udp;ofi_rxd`. With `--rack`: between the first two hosts of a
//! virtual rack (in memory domains of their own, so rackwire goes over the edge transport
//! striped on every rail) against `tcp` on one rail (`FI_TCP_IFACE`, as its users pick a NIC).
//! Reported: the 64 B round trip's half (µs per transfer, as fi_pingpong prints it) and 1 MiB's
//! MB/s, each provider's median run with the spread, and rackwire's per-repeat ratio against
//! each peer. Where libfabric's own test suite is built (`scripts/fabtests.sh` puts it in
//! `target/fabtests`), its `fi_rdm_tagged_bw` and `fi_rma_bw -o write` and `-o read` at 1 MiB too, in the same
//! way (addresses exchanged out of band, `-E`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::repeat::median_spread;
use anyhow::{bail, Context, Result};
use rackwire::ManagementHost;
use rackwire_rack::{HostState, RackState};

/// Repeats at most.
const REPEAT_MAX: usize = 50;
/// The providers measured on this machine, rackwire first.
const PROVIDERS: [&str; 4] = ["rackwire", "shm", "tcp", "udp;ofi_rxd"];
/// The providers measured over a rack's rails, rackwire first.
const RACK_PROVIDERS: [&str; 2] = ["rackwire", "tcp"];
/// Round trips at 64 B over a rack's rails (at full scale), where each takes tens of µs.
const RACK_ITERS: f64 = 10_000.0;
/// Round trips at 64 B (at full scale): enough that setting up the connection (its first
/// message, timed by fi_pingpong like any other) weighs little, for every provider.
const ITERS: f64 = 50_000.0;
/// Round trips at 1 MiB per one at 64 B.
const LARGE_PER_SMALL: u64 = 100;
/// How long one fi_pingpong pair may take.
const RUN_LIMIT: Duration = Duration::from_secs(120);
const SECRET: &str = "rackwire-bench-ofi-secret";

/// One run's figures: µs per transfer at 64 B, MB/s at 1 MiB; with fabtests, the MB/s of its
/// tagged bandwidth test and of its RMA write and read bandwidth tests at 1 MiB (none where the
/// provider cannot run the test).
#[derive(Clone, Copy, Debug)]
struct Figures {
    lat_us: f64,
    mb_s: f64,
    tagged_bw: Option<f64>,
    rma_bw: Option<f64>,
    rma_read_bw: Option<f64>,
}

/// Transfers of a fabtests bandwidth test (at full scale).
const FABTESTS_ITERS: f64 = 200.0;

/// fabtests' programs, where `scripts/fabtests.sh` built them (`target/fabtests/install/bin`
/// beside this executable's profile folder).
fn fabtests_dir() -> Option<PathBuf> {
    let exe = crate::spawn::own_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("fabtests/install/bin");
    bin.join("fi_rdm_tagged_bw").exists().then_some(bin)
}

/// The folder holding `librackwire-fi.so`: `ofi/` beside this executable (where
/// `cargo build --release -p rackwire-ofi` links it), or `FI_PROVIDER_PATH`.
pub fn provider_dir() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FI_PROVIDER_PATH") {
        return Ok(PathBuf::from(p));
    }
    let exe = crate::spawn::own_exe()?;
    let dir = exe.parent().context("own folder")?.join("ofi");
    if !dir.join("librackwire-fi.so").exists() {
        bail!(
            "no provider at {}: build it with `cargo build --release -p rackwire-ofi` (or set FI_PROVIDER_PATH)",
            dir.display()
        );
    }
    Ok(dir)
}

/// The rows of fi_pingpong's table: size label -> (MB/s, µs per transfer).
fn parse(out: &str) -> BTreeMap<String, (f64, f64)> {
    let mut rows = BTreeMap::new();
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 8 && f[2].starts_with('=') {
            if let (Ok(mb), Ok(us)) = (f[5].parse::<f64>(), f[6].parse::<f64>()) {
                rows.insert(f[0].to_string(), (mb, us));
            }
        }
    }
    rows
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Where the two ends of a pair run.
enum Place<'a> {
    /// Both on this machine, joining the management host at `mh`.
    Here { mh: &'a str },
    /// The server in one host of a rack, the client in another.
    Rack { state: &'a RackState, server: &'a HostState, client: &'a HostState },
}

impl Place<'_> {
    /// `program` over `provider` for the server (or the client), with what the provider
    /// needs: the fabric's settings for rackwire (over a rack: the host's rails, the edge
    /// transport), the first rail's device for `tcp` over a rack.
    fn command(&self, program: &Path, provider: &str, server: bool, dir: &Path) -> Command {
        let mut c = match self {
            Place::Here { mh } => {
                let mut c = Command::new(program);
                c.env(rackwire::vars::MH, mh).env(rackwire::vars::SECRET, SECRET);
                c
            }
            Place::Rack { state, server: s, client: cl } => {
                let host = if server { s } else { cl };
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &host.ns]).arg(program);
                if provider == "rackwire" {
                    c.envs(rackwire_rack::program_env(state, host)).env(rackwire::vars::TRANSPORT, "edge");
                } else if let Some(dev) = host.link_devs().split(',').next() {
                    c.env("FI_TCP_IFACE", dev);
                }
                c
            }
        };
        c.env("FI_PROVIDER_PATH", dir).env_remove(rackwire::vars::NAME).env_remove(rackwire::vars::CONFIG);
        c
    }

    /// The server's address for fi_pingpong's out-of-band exchange.
    fn server_addr(&self) -> String {
        match self {
            Place::Here { .. } => "127.0.0.1".into(),
            Place::Rack { server, .. } => server.addrs[0].to_string(),
        }
    }
}

/// How a server and its client name the port of their out-of-band exchange.
enum Oob {
    /// fi_pingpong's: `-B PORT` for the server, `-P PORT` for the client.
    Pingpong,
    /// fabtests': `-E=PORT` for both; for a provider whose addresses are IP ports (not
    /// rackwire's), a port of its own for the server (`-B`), which the client names (`-P`), so
    /// the two ends do not take the same one.
    Fabtests,
}

/// One server and client pair of `program` over `provider` (`args` for both, the client given
/// the server's address); the client's output.
fn pair(program: &Path, provider: &str, args: &[&str], oob: Oob, dir: &Path, place: &Place) -> Result<String> {
    let port = free_port()?.to_string();
    let (server_extra, mut client_args) = match oob {
        Oob::Pingpong => (vec!["-B".to_string(), port.clone()], vec!["-P".to_string(), port]),
        Oob::Fabtests if provider == "rackwire" => (vec![format!("-E={port}")], vec![format!("-E={port}")]),
        Oob::Fabtests => {
            let own = free_port()?.to_string();
            (vec![format!("-E={port}"), "-B".into(), own.clone()], vec![format!("-E={port}"), "-P".into(), own])
        }
    };
    let name = program.file_name().map_or_else(|| program.display().to_string(), |n| n.to_string_lossy().into());
    let cmd = |server: bool, extra: &[String]| {
        let mut c = place.command(program, provider, server, dir);
        c.args(["-p", provider]).args(args).args(extra);
        c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let mut server = cmd(true, &server_extra).spawn().with_context(|| format!("running {name}"))?;
    std::thread::sleep(Duration::from_millis(300));
    client_args.push(place.server_addr());
    let mut client = cmd(false, &client_args).spawn()?;
    let deadline = Instant::now() + RUN_LIMIT;
    while client.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = client.kill();
            let _ = server.kill();
            bail!("{name} over {provider} took longer than {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = client.wait_with_output()?;
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&c.stdout).to_string() + &String::from_utf8_lossy(&c.stderr);
    if !c.status.success() {
        bail!("{name} over {provider} failed:\n{text}");
    }
    Ok(text)
}

/// One fi_pingpong pair over `provider` at `size` bytes; the client's rows.
fn pingpong(provider: &str, size: &str, iters: u64, dir: &Path, place: &Place) -> Result<BTreeMap<String, (f64, f64)>> {
    let iters = iters.to_string();
    let args = ["-e", "rdm", "-m", "tagged", "-S", size, "-I", &iters];
    Ok(parse(&pair(Path::new("fi_pingpong"), provider, &args, Oob::Pingpong, dir, place)?))
}

/// The MB/s of a fabtests bandwidth test (`program`, with `args`) at 1 MiB over `provider`.
fn fabtest_bw(program: &Path, args: &[&str], provider: &str, iters: u64, dir: &Path, place: &Place) -> Result<f64> {
    let iters = iters.to_string();
    let mut all = vec!["-S", "1048576", "-I", &iters];
    all.extend_from_slice(args);
    let text = pair(program, provider, &all, Oob::Fabtests, dir, place)?;
    // Its table: bytes, iters, total, time, MB/sec, usec/xfer, Mxfers/sec.
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() == 7 && f[0] == "1m")
        .and_then(|f| f[4].parse().ok())
        .with_context(|| format!("{} over {provider} printed no 1 MiB row:\n{text}", program.display()))
}

fn measure(provider: &str, iters: u64, dir: &Path, place: &Place, fabtests: Option<(&Path, u64)>) -> Result<Figures> {
    let small = pingpong(provider, "64", iters, dir, place)?;
    let large = pingpong(provider, "1048576", (iters / LARGE_PER_SMALL).max(10), dir, place)?;
    let (Some(s), Some(l)) = (small.get("64"), large.get("1m")) else {
        bail!("fi_pingpong over {provider} printed no 64 B or 1 MiB row");
    };
    let mut f = Figures { lat_us: s.1, mb_s: l.0, tagged_bw: None, rma_bw: None, rma_read_bw: None };
    if let Some((bin, n)) = fabtests {
        // A peer that cannot run a test here has no figure for it (said in a note: `udp;ofi_rxd`
        // refuses the addresses the tests insert); rackwire must run both.
        let bw = |prog: &str, args: &[&str]| match fabtest_bw(&bin.join(prog), args, provider, n, dir, place) {
            Ok(v) => Ok(Some(v)),
            Err(e) if provider != "rackwire" => {
                let why = e.to_string();
                let last = why.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim().to_string();
                eprintln!("note: {prog} over {provider} cannot run here: {last}");
                Ok(None)
            }
            Err(e) => Err(e),
        };
        f.tagged_bw = bw("fi_rdm_tagged_bw", &[])?;
        f.rma_bw = bw("fi_rma_bw", &["-e", "rdm", "-o", "write"])?;
        f.rma_read_bw = bw("fi_rma_bw", &["-e", "rdm", "-o", "read"])?;
    }
    Ok(f)
}

/// The rack `rack` describes (or names, if up), if given, with its first two hosts in memory
/// domains of their own; its state and what takes it down.
pub fn rack_for_two(rack: Option<&Path>) -> Result<(Option<RackState>, Option<rackwire_rack::DownOnDrop>)> {
    let Some(rack) = rack else { return Ok((None, None)) };
    let (state, down) = crate::spawn::rack_up(rack, true)?;
    let hosts = rackwire_rack::place::rank_hosts(&state);
    if hosts.len() < 2 || hosts[0].domain == hosts[1].domain {
        bail!("--rack: the rack needs two hosts in memory domains of their own (as examples/racks/2l-1g.toml has)");
    }
    Ok((Some(state), down))
}

/// `rackwire bench ofi` (over the rack `rack` describes, if given).
pub fn run(repeat: usize, scale: f64, json: bool, rack: Option<&Path>) -> Result<()> {
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    let dir = provider_dir()?;
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes())?;
    let addr = mh.addr().to_string();
    let (state, _down) = rack_for_two(rack)?;
    let (place, providers, iters): (Place, &[&str], u64) = match &state {
        None => (Place::Here { mh: &addr }, &PROVIDERS, ((ITERS * scale) as u64).max(100)),
        Some(s) => {
            let hosts = rackwire_rack::place::rank_hosts(s);
            let place = Place::Rack { state: s, server: hosts[1], client: hosts[0] };
            (place, &RACK_PROVIDERS, ((RACK_ITERS * scale) as u64).max(100))
        }
    };
    let fabtests = fabtests_dir();
    let fab = fabtests.as_deref().map(|b| (b, ((FABTESTS_ITERS * scale) as u64).max(10)));
    let mut runs: BTreeMap<&str, Vec<Figures>> = BTreeMap::new();
    for rep in 0..repeat {
        for i in 0..providers.len() {
            let p = providers[(i + rep) % providers.len()];
            runs.entry(p).or_default().push(measure(p, iters, &dir, &place, fab)?);
        }
    }
    let ours = &runs["rackwire"];
    let triple = |t: (f64, f64, f64)| serde_json::json!({ "median": t.0, "lo": t.1, "hi": t.2 });
    let fmt = |t: (f64, f64, f64), d: usize| format!("{:.*} ({:.*}–{:.*})", d, t.0, d, t.1, d, t.2);
    let mut table = crate::table();
    table.set_header([
        "provider",
        "64 B µs/xfer",
        "1 MiB MB/s",
        "rackwire's 64 B / theirs",
        "rackwire's 1 MiB / theirs",
    ]);
    let mut fab_table = crate::table();
    fab_table.set_header([
        "provider",
        "fi_rdm_tagged_bw 1 MiB MB/s",
        "rackwire's / theirs",
        "fi_rma_bw -o write 1 MiB MB/s",
        "rackwire's / theirs",
        "fi_rma_bw -o read 1 MiB MB/s",
        "rackwire's / theirs",
    ]);
    let mut doc = serde_json::Map::new();
    for &p in providers {
        let r = &runs[p];
        let lat = median_spread(&mut r.iter().map(|f| f.lat_us).collect::<Vec<_>>());
        let bw = median_spread(&mut r.iter().map(|f| f.mb_s).collect::<Vec<_>>());
        let lat_ratio = median_spread(&mut ours.iter().zip(r).map(|(o, t)| o.lat_us / t.lat_us).collect::<Vec<_>>());
        let bw_ratio = median_spread(&mut ours.iter().zip(r).map(|(o, t)| o.mb_s / t.mb_s).collect::<Vec<_>>());
        doc.insert(
            p.to_string(),
            serde_json::json!({ "lat_us_64b": triple(lat), "mb_s_1mib": triple(bw),
                                "ours_over_theirs_lat": triple(lat_ratio), "ours_over_theirs_bw": triple(bw_ratio) }),
        );
        let (lr, br) =
            if p == "rackwire" { ("—".into(), "—".into()) } else { (fmt(lat_ratio, 2), fmt(bw_ratio, 2)) };
        table.add_row([p.to_string(), fmt(lat, 2), fmt(bw, 0), lr, br]);
        if fab.is_some() {
            let entry = doc.get_mut(p).and_then(|v| v.as_object_mut()).expect("inserted above");
            let mut row = vec![p.to_string()];
            let picks: [(&str, Pick); 3] = [
                ("tagged_bw_1mib", |f| f.tagged_bw),
                ("rma_write_bw_1mib", |f| f.rma_bw),
                ("rma_read_bw_1mib", |f| f.rma_read_bw),
            ];
            for (key, pick) in picks {
                let (col, ratio) = fabtest_figure(ours, r, pick);
                row.push(col.map_or("—".into(), |t| fmt(t, 0)));
                row.push(if p == "rackwire" { "—".into() } else { ratio.map_or("—".into(), |t| fmt(t, 2)) });
                entry.insert(
                    key.into(),
                    serde_json::json!({ "mb_s": col.map(triple), "ours_over_theirs": ratio.map(triple) }),
                );
            }
            fab_table.add_row(row);
        }
    }
    let rails = state.as_ref().map(|s| s.config.name.clone());
    if json {
        doc.insert("meta".into(), serde_json::json!({ "repeats": repeat, "iters_64b": iters, "rack": rails }));
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("{table}");
    let over = match &state {
        Some(s) => format!(
            "between two hosts of rack {} (rackwire: the edge transport on its {} rails; tcp: the first rail)",
            s.config.name,
            s.config.rails.len()
        ),
        None => "on this machine".into(),
    };
    println!(
        "(fi_pingpong -e rdm -m tagged {over}, {iters} round trips at 64 B, {} at 1 MiB; {repeat} repeats, providers rotated; \
         below 1 is faster for latency, above 1 for bandwidth)",
        (iters / LARGE_PER_SMALL).max(10)
    );
    if let Some((_, n)) = fab {
        println!("{fab_table}");
        println!("(fabtests v1.17, {n} transfers of 1 MiB each, in the same runs; —: the provider cannot run it here)");
    }
    Ok(())
}

/// A median with its spread (low, high).
type Spread = (f64, f64, f64);
/// One fabtests figure of a run.
type Pick = fn(&Figures) -> Option<f64>;

/// A fabtests figure of one provider's runs `theirs` (median, spread), and rackwire's
/// per-repeat ratio against it; none where a run has no figure.
fn fabtest_figure(
    ours: &[Figures],
    theirs: &[Figures],
    pick: fn(&Figures) -> Option<f64>,
) -> (Option<Spread>, Option<Spread>) {
    let col: Option<Vec<f64>> = theirs.iter().map(pick).collect();
    let ratio: Option<Vec<f64>> = ours.iter().zip(theirs).map(|(o, t)| Some(pick(o)? / pick(t)?)).collect();
    (col.map(|mut v| median_spread(&mut v)), ratio.map(|mut v| median_spread(&mut v)))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the parser against fi_pingpong's table as it prints it: the header and debug
    // lines are skipped, each row gives its size label, MB/s and µs per transfer.
    #[test]
    fn fi_pingpong_rows_are_read() {
        let out = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                   64      2k      =2k      250k        0.01s     46.85       1.37       0.73\n\
                   [debug] util/pingpong.c:1907: Resources freed\n\
                   1m      2k      =2k      3.9g        3.76s   1116.00     939.59       0.00\n";
        let rows = parse(out);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows["64"], (46.85, 1.37));
        assert_eq!(rows["1m"], (1116.0, 939.59));
    }
}
