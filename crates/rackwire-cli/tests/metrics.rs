//! Observability as an operator meets it: `rackwire mh --metrics` and a node's `metrics`
//! setting serve the Prometheus text format, scraped with a real HTTP client (curl) and
//! checked by Prometheus's own `promtool check metrics`; `--log-format json` logs JSON lines.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rackwire::{Access, Fabric, FabricConfig, OpFlags, TransportChoice};
use rackwire_tests::{Reaped, TempDir};

const SECRET: &str = "metrics-test-secret";

/// `curl -sf URL`: the page.
fn scrape(url: &str) -> String {
    let o = Command::new("curl").args(["-sf", "--max-time", "10", url]).output().expect("curl runs");
    assert!(o.status.success(), "curl {url}: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).expect("the page is UTF-8")
}

/// `promtool check metrics` on `page`: None when promtool is not installed (said on stderr),
/// else its verdict.
fn promtool(page: &str) -> Option<Result<(), String>> {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool not installed (Debian package prometheus): its check skipped here; CI installs it");
        return None;
    };
    child.stdin.take().unwrap().write_all(page.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    Some(if o.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    })
}

/// The value of the sample whose line starts with `series` (name and labels as written).
fn value(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

// Checks the management host's and a node's endpoints: `rackwire mh --metrics --log-format
// json` logs JSON lines and serves nodes by state and admissions; two edge nodes exchange
// writes (sealed frames), one write the owner never granted and three datagrams; the owner's
// page, scraped with curl, has per-peer and per-link counters (frames, the three datagrams
// received, round-trip time, window) and the refusal in its audit (region, peer, reason); both
// pages pass `promtool check metrics`.
#[test]
fn metrics_endpoints_pass_promtool() {
    let state = TempDir::new("metrics-mh");
    let mut mh = Reaped(
        Command::new(env!("CARGO_BIN_EXE_rackwire"))
            .args(["mh", "--listen", "127.0.0.1:0", "--state", state.0.to_str().unwrap()])
            .args(["--metrics", "127.0.0.1:0", "--log-format", "json"])
            .env(rackwire::vars::SECRET, SECRET)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mh"),
    );
    let mut lines = BufReader::new(mh.0.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut addr, mut metrics, mut json_lines) = (None, None, 0);
    while addr.is_none() || metrics.is_none() {
        assert!(Instant::now() < deadline, "mh did not report its addresses");
        let line = lines.next().expect("mh output").unwrap();
        if let Some(rest) = line.strip_prefix("management host on ") {
            addr = rest.split_whitespace().next().map(String::from);
        } else if let Some(rest) = line.strip_prefix("metrics on ") {
            metrics = Some(rest.trim().to_string());
        } else {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
            assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
            json_lines += 1;
        }
    }
    assert!(json_lines >= 1, "the management host logged in JSON");
    std::thread::spawn(move || lines.for_each(drop));
    let addr = addr.unwrap();

    let node = |name: &str, dir: &TempDir| {
        let mut c = FabricConfig::new(&addr, SECRET, name);
        c.state_dir = Some(dir.0.clone());
        c.transport = TransportChoice::Edge;
        c.links = vec!["127.0.0.1:0".into()];
        c.metrics = Some("127.0.0.1:0".into());
        Fabric::join(c).expect("join")
    };
    let (da, db) = (TempDir::new("metrics-a"), TempDir::new("metrics-b"));
    let (owner, peer) = (node("owner", &da), node("peer", &db));
    let granted = owner.alloc(4096, Access::ALL).unwrap();
    let closed = owner.alloc(4096, Access::ALL).unwrap();
    granted.grant(peer.id(), Access::WRITE).unwrap();
    let c = peer.connect(owner.id()).unwrap();
    for i in 0..20u64 {
        c.write(&granted.handle(), i * 8, &i.to_le_bytes(), OpFlags::default()).wait().unwrap();
    }
    assert!(c.write(&closed.handle(), 0, b"no", OpFlags::default()).wait().is_err());
    // Three datagrams, each read by the owner before the page is taken.
    for i in 0..3u8 {
        c.send_datagram(&[i; 16]).unwrap();
        assert_eq!(owner.recv_timeout(Duration::from_secs(10)).expect("datagram").data, [i; 16]);
    }

    let url = format!("http://{}/metrics", owner.metrics_addr().expect("the node serves metrics"));
    let page = scrape(&url);
    let p = peer.id().to_string();
    let sent = value(&page, &format!("rackwire_peer_frames_sent_total{{peer=\"{p}\",transport=\"edge\"}}"));
    assert!(sent.is_some_and(|n| n > 0.0), "per-peer frames:\n{page}");
    assert_eq!(value(&page, &format!("rackwire_peer_sealed{{peer=\"{p}\",transport=\"edge\"}}")), Some(1.0));
    let datagrams = format!("rackwire_peer_datagrams_received_total{{peer=\"{p}\",transport=\"edge\"}}");
    assert_eq!(value(&page, &datagrams), Some(3.0), "datagrams received:\n{page}");
    let rtt = value(&page, &format!("rackwire_link_rtt_seconds{{peer=\"{p}\",link=\"0\"}}"));
    assert!(rtt.is_some_and(|s| s > 0.0 && s < 1.0), "per-link round trip:\n{page}");
    // The quickest round trip is measured too, and is no longer than the smoothed one.
    let min_rtt = value(&page, &format!("rackwire_link_min_rtt_seconds{{peer=\"{p}\",link=\"0\"}}"));
    assert!(min_rtt.is_some_and(|m| m > 0.0 && Some(m) <= rtt), "per-link quickest round trip:\n{page}");
    assert!(value(&page, &format!("rackwire_link_window_frames{{peer=\"{p}\",link=\"0\"}}")).is_some_and(|w| w > 0.0));
    let refused =
        format!("rackwire_refused_total{{region=\"{}\",peer=\"{p}\",reason=\"ungranted\"}}", closed.handle().region());
    assert_eq!(value(&page, &refused), Some(1.0), "the owner's audit:\n{page}");
    if let Some(verdict) = promtool(&page) {
        verdict.unwrap_or_else(|e| panic!("promtool on the node's page: {e}\n{page}"));
    }

    let mh_page = scrape(&metrics.unwrap());
    assert_eq!(value(&mh_page, "rackwire_mh_nodes{state=\"up\"}"), Some(2.0), "{mh_page}");
    assert!(value(&mh_page, "rackwire_mh_admissions_total{outcome=\"admitted\"}").is_some_and(|n| n >= 2.0));
    if let Some(verdict) = promtool(&mh_page) {
        verdict.unwrap_or_else(|e| panic!("promtool on the management host's page: {e}\n{mh_page}"));
    }
    drop((owner, peer));
}
