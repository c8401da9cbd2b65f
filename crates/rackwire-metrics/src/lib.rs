//! Observability: counters in the Prometheus text exposition format (version 0.0.4), written
//! with [`Text`] and served by [`Exporter`] at `GET /metrics` on an address of the operator's
//! choosing. Every long-running rackwire process can serve one: the management host, the
//! agent, any node (its `metrics` setting).
//!
//! The server is deliberately small: one request per connection, each served on a thread of
//! its own, at most [`CONNECTIONS_MAX`] at once (more are closed at once), each bounded in
//! size ([`REQUEST_BYTES_MAX`]) and in time as a whole ([`REQUEST_TIMEOUT`], however slowly
//! the client sends or reads): a client that dribbles its request holds one connection for at
//! most that long, and never the scrapers behind it.

#![deny(unsafe_code)]

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The largest request read (its line and headers).
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long a client has to send its request and take the answer, in all.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once; one more is closed unanswered.
pub const CONNECTIONS_MAX: usize = 8;
/// How often the accepting thread looks whether it should stop.
const STOP_POLL: Duration = Duration::from_millis(50);

/// What a metric family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only grows (its name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
}

/// A page in the text format, family by family.
#[derive(Debug, Default)]
pub struct Text {
    out: String,
}

/// Escape a label value: backslash, double quote and newline.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Whether `name` is a valid metric or label name.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

impl Text {
    /// An empty page.
    pub fn new() -> Self {
        Text::default()
    }

    /// Start a family: its help line and type. Its samples follow.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        debug_assert!(valid_name(name), "metric name {name:?}");
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample of the family last started.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                debug_assert!(valid_name(k), "label name {k:?}");
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        if value.is_finite() && value.fract() == 0.0 && value.abs() < 1e15 {
            let _ = writeln!(self.out, " {}", value as i64);
        } else {
            let _ = writeln!(self.out, " {value}");
        }
    }

    /// A family with a single unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// The page.
    pub fn finish(self) -> String {
        self.out
    }
}

/// What renders the page on each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics` until dropped.
pub struct Exporter {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").field("addr", &self.addr).finish()
    }
}

impl Exporter {
    /// Listen on `addr` (`host:port`; port 0 picks one) and serve what `render` writes.
    pub fn start(addr: &str, render: Render) -> std::io::Result<Exporter> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let active = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new().name("rw-metrics".into()).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        if active.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
                            active.fetch_sub(1, Ordering::SeqCst);
                            tracing::debug!("metrics: {CONNECTIONS_MAX} connections served already; one closed");
                            continue;
                        }
                        let (render, done) = (render.clone(), active.clone());
                        let served = std::thread::Builder::new().name("rw-metrics-req".into()).spawn(move || {
                            if let Err(e) = answer(s, &render) {
                                tracing::debug!("metrics request: {e}");
                            }
                            done.fetch_sub(1, Ordering::SeqCst);
                        });
                        if served.is_err() {
                            active.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(STOP_POLL),
                    Err(e) => {
                        tracing::debug!("metrics accept: {e}");
                        std::thread::sleep(STOP_POLL);
                    }
                }
            }
        })?;
        Ok(Exporter { addr, stop, thread: Some(thread) })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The time left before `deadline`, or a timed-out error.
fn left(deadline: Instant) -> std::io::Result<Duration> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the request's time is up"));
    }
    Ok(d)
}

/// Read one request (to the blank line ending its headers) and answer it, within
/// [`REQUEST_TIMEOUT`] in all.
fn answer(mut s: TcpStream, render: &Render) -> std::io::Result<()> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    s.set_nonblocking(false)?;
    let mut req = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        s.set_read_timeout(Some(left(deadline)?))?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
        if req.len() > REQUEST_BYTES_MAX {
            return reply(&mut s, "431 Request Header Fields Too Large", "request too large\n", deadline);
        }
    }
    let line = req.split(|&b| b == b'\r').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => reply(&mut s, "200 OK", &render(), deadline),
        ("GET", _) => reply(&mut s, "404 Not Found", "metrics are at /metrics\n", deadline),
        _ => reply(&mut s, "405 Method Not Allowed", "GET only\n", deadline),
    }
}

fn reply(s: &mut TcpStream, status: &str, body: &str, deadline: Instant) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // Written piece by piece, each with the time left: a client that reads slowly is cut off
    // at the deadline, however the page is split.
    for part in [head.as_bytes(), body.as_bytes()] {
        let mut at = 0;
        while at < part.len() {
            s.set_write_timeout(Some(left(deadline)?))?;
            match s.write(&part[at..]) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => at += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the text format: help and type lines, labels quoted with their values escaped,
    // whole numbers without a fraction, others as floats.
    #[test]
    fn writes_the_text_format() {
        let mut t = Text::new();
        t.family("rw_x_total", Kind::Counter, "What x counts.");
        t.sample("rw_x_total", &[("peer", "7"), ("why", "a \"q\"\\\n")], 12.0);
        t.single("rw_y", Kind::Gauge, "A gauge.", 0.5);
        assert_eq!(
            t.finish(),
            "# HELP rw_x_total What x counts.\n# TYPE rw_x_total counter\nrw_x_total{peer=\"7\",why=\"a \\\"q\\\"\\\\\\n\"} 12\n\
             # HELP rw_y A gauge.\n# TYPE rw_y gauge\nrw_y 0.5\n"
        );
        assert!(valid_name("rackwire_peer_frames_total") && !valid_name("9x") && !valid_name("a-b"));
    }

    // Checks the server: GET /metrics answers 200 with the rendered page and its length,
    // another path 404, another method 405; it stops when dropped (the port is free again).
    #[test]
    fn serves_metrics_over_http() {
        let e = Exporter::start("127.0.0.1:0", Arc::new(|| "rw_up 1\n".to_string())).unwrap();
        let get = |req: &str| {
            let mut s = TcpStream::connect(e.addr()).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(
            ok.starts_with("HTTP/1.1 200 OK\r\n")
                && ok.contains("Content-Length: 8\r\n")
                && ok.ends_with("\r\n\r\nrw_up 1\n")
        );
        assert!(get("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let addr = e.addr();
        drop(e);
        assert!(TcpListener::bind(addr).is_ok(), "the port is free after the exporter stopped");
    }

    // Checks that a slow client holds neither the server nor its own connection for long
    // (issue: one thread and a per-read timeout, so a client sending a byte every 1.9 s held
    // the endpoint for hours): a client sends a byte of its request every 500 ms; meanwhile
    // another client's scrape is answered at once (under 1.5 s, where the old server kept it
    // waiting behind the slow one for over ten); the slow client's connection is closed
    // unanswered about REQUEST_TIMEOUT after it opened (under 5 s, the client giving up at 6),
    // though every single read came within the timeout. More than CONNECTIONS_MAX idle
    // connections at once: one more is closed at once, and scraping works again when they go.
    #[test]
    fn a_slow_client_holds_nothing_for_long() {
        let e = Exporter::start("127.0.0.1:0", Arc::new(|| "rw_up 1\n".to_string())).unwrap();
        let addr = e.addr();
        let slow = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut s = TcpStream::connect(addr).unwrap();
            for b in b"GET /metrics HTTP/1.1\r\n" {
                if s.write_all(&[*b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(500));
                if t0.elapsed() > Duration::from_secs(6) {
                    break;
                }
            }
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            (t0.elapsed(), out)
        });
        std::thread::sleep(Duration::from_millis(200));
        let t0 = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.ends_with("rw_up 1\n") && t0.elapsed() < Duration::from_millis(1500), "{:?}", t0.elapsed());
        let (took, answered) = slow.join().unwrap();
        assert!(answered.is_empty(), "the slow client was answered: {answered}");
        assert!(took < Duration::from_secs(5), "the slow client held its connection {took:?}");
        let idle: Vec<TcpStream> = (0..CONNECTIONS_MAX).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(300));
        let mut extra = TcpStream::connect(addr).unwrap();
        extra.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut b = [0u8; 16];
        assert_eq!(extra.read(&mut b).unwrap_or(0), 0, "one connection past the limit is closed at once");
        drop(idle);
        std::thread::sleep(Duration::from_millis(300));
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"));
    }
}
