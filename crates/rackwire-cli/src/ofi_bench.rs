//! `rackwire bench ofi`: libfabric's own ping-pong (`fi_pingpong`, Debian's libfabric-bin)
//! between two processes over the `rackwire` provider and over libfabric's own providers,
//! each as its users run it (`-e rdm`, tagged messages, the provider picked with `-p`, nothing
//! else tuned), in the same run, the providers' order rotated every repeat. On this machine:
//! against `shm`, `tcp` and `udp;ofi_rxd`. With `--rack`: between the first two hosts of a
//! virtual rack (in memory domains of their own, so rackwire goes over the edge transport
//! striped on every rail) against `tcp` on one rail (`FI_TCP_IFACE`, as its users pick a NIC).
//! Reported: the 64 B round trip's half (µs per transfer, as fi_pingpong prints it) and 1 MiB's
//! MB/s, each provider's median run with the spread, and rackwire's per-repeat ratio against
//! each peer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rackwire::ManagementHost;
use rackwire_bench::repeat::median_spread;
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

/// One run's figures: µs per transfer at 64 B, MB/s at 1 MiB.
#[derive(Clone, Copy, Debug)]
struct Figures {
    lat_us: f64,
    mb_s: f64,
}

/// The folder holding `librackwire-fi.so`: `ofi/` beside this executable (where
/// `cargo build --release -p rackwire-ofi` links it), or `FI_PROVIDER_PATH`.
pub(crate) fn provider_dir() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FI_PROVIDER_PATH") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("own executable")?;
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
    /// `fi_pingpong` over `provider` for the server (or the client), with what the provider
    /// needs: the fabric's settings for rackwire (over a rack: the host's rails, the edge
    /// transport), the first rail's device for `tcp` over a rack.
    fn command(&self, provider: &str, server: bool, dir: &Path) -> Command {
        let mut c = match self {
            Place::Here { mh } => {
                let mut c = Command::new("fi_pingpong");
                c.env("RACKWIRE_MH", mh).env("RACKWIRE_SECRET", SECRET);
                c
            }
            Place::Rack { state, server: s, client: cl } => {
                let host = if server { s } else { cl };
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &host.ns, "fi_pingpong"]);
                if provider == "rackwire" {
                    c.envs(rackwire_rack::program_env(state, host)).env("RACKWIRE_TRANSPORT", "edge");
                } else if let Some(dev) = host.link_devs().split(',').next() {
                    c.env("FI_TCP_IFACE", dev);
                }
                c
            }
        };
        c.env("FI_PROVIDER_PATH", dir).env_remove("RACKWIRE_NAME").env_remove("RACKWIRE_CONFIG");
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

/// One fi_pingpong pair over `provider` at `size` bytes; the client's rows.
fn pingpong(provider: &str, size: &str, iters: u64, dir: &Path, place: &Place) -> Result<BTreeMap<String, (f64, f64)>> {
    let port = free_port()?.to_string();
    let iters = iters.to_string();
    let args = ["-p", provider, "-e", "rdm", "-m", "tagged", "-S", size, "-I", &iters];
    let cmd = |server: bool, extra: &[&str]| {
        let mut c = place.command(provider, server, dir);
        c.args(args).args(extra).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let mut server = cmd(true, &["-B", &port]).spawn().context("running fi_pingpong (install libfabric-bin)")?;
    std::thread::sleep(Duration::from_millis(300));
    let mut client = cmd(false, &["-P", &port, &place.server_addr()]).spawn()?;
    let deadline = Instant::now() + RUN_LIMIT;
    while client.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = client.kill();
            let _ = server.kill();
            bail!("fi_pingpong over {provider} took longer than {RUN_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let c = client.wait_with_output()?;
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&c.stdout).to_string() + &String::from_utf8_lossy(&c.stderr);
    if !c.status.success() {
        bail!("fi_pingpong over {provider} failed:\n{text}");
    }
    Ok(parse(&text))
}

fn measure(provider: &str, iters: u64, dir: &Path, place: &Place) -> Result<Figures> {
    let small = pingpong(provider, "64", iters, dir, place)?;
    let large = pingpong(provider, "1048576", (iters / LARGE_PER_SMALL).max(10), dir, place)?;
    match (small.get("64"), large.get("1m")) {
        (Some(s), Some(l)) => Ok(Figures { lat_us: s.1, mb_s: l.0 }),
        _ => bail!("fi_pingpong over {provider} printed no 64 B or 1 MiB row"),
    }
}

/// The rack `rack` describes (or names, if up), with its first two hosts in memory domains of
/// their own; its state and what takes it down.
pub(crate) fn rack_for_two(rack: &Path) -> Result<(RackState, Option<rackwire_rack::DownOnDrop>)> {
    let (state, down) = crate::launch::rack_up(rack, true)?;
    let hosts = crate::launch::rank_hosts(&state);
    if hosts.len() < 2 || hosts[0].domain == hosts[1].domain {
        bail!("--rack: the rack needs two hosts in memory domains of their own (as examples/racks/2l-1g.toml has)");
    }
    Ok((state, down))
}

/// `rackwire bench ofi` (over the rack `rack` describes, if given).
pub(crate) fn run(repeat: usize, scale: f64, json: bool, rack: Option<&Path>) -> Result<()> {
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    let dir = provider_dir()?;
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes())?;
    let addr = mh.addr().to_string();
    let (state, _down) = match rack {
        Some(r) => {
            let (s, d) = rack_for_two(r)?;
            (Some(s), d)
        }
        None => (None, None),
    };
    let (place, providers, iters): (Place, &[&str], u64) = match &state {
        None => (Place::Here { mh: &addr }, &PROVIDERS, ((ITERS * scale) as u64).max(100)),
        Some(s) => {
            let hosts = crate::launch::rank_hosts(s);
            let place = Place::Rack { state: s, server: hosts[1], client: hosts[0] };
            (place, &RACK_PROVIDERS, ((RACK_ITERS * scale) as u64).max(100))
        }
    };
    let mut runs: BTreeMap<&str, Vec<Figures>> = BTreeMap::new();
    for rep in 0..repeat {
        for i in 0..providers.len() {
            let p = providers[(i + rep) % providers.len()];
            runs.entry(p).or_default().push(measure(p, iters, &dir, &place)?);
        }
    }
    let ours = &runs["rackwire"];
    let triple = |t: (f64, f64, f64)| serde_json::json!({ "median": t.0, "lo": t.1, "hi": t.2 });
    let fmt = |t: (f64, f64, f64), d: usize| format!("{:.*} ({:.*}–{:.*})", d, t.0, d, t.1, d, t.2);
    let mut table = comfy_table::Table::new();
    table.set_header([
        "provider",
        "64 B µs/xfer",
        "1 MiB MB/s",
        "rackwire's 64 B / theirs",
        "rackwire's 1 MiB / theirs",
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
    Ok(())
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
