//! `rackwire bench lang`: the same ping-pong and one-way bandwidth from Rust, C (the C ABI)
//! and Python (the bindings), in the same run, so the cost of each interface shows as a ratio
//! to Rust.
//!
//! All three speak one protocol (examples/c/pingpong.c, examples/python/pingpong.py and
//! [`worker`] here): each side publishes a 4 KiB region and grants it to the other; the
//! client writes 8 bytes with a notification into the server's region, the server waits for
//! the notification, checks the bytes in its own memory and answers the same way. The
//! bandwidth pair writes 1 MiB from an ordinary buffer into the server's region, waiting for
//! each write, as a program that streams a buffer would.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::repeat::median_spread;
use anyhow::{bail, Context, Result};
use rackwire::{Access, Fabric, FabricConfig, OpFlags};

/// Bytes of one bandwidth write.
const BW_BYTES: usize = 1 << 20;
/// How long a worker waits for its peer at any step.
const STEP: Duration = Duration::from_secs(30);
/// Repeats at most.
const REPEAT_MAX: usize = 50;
const C_SOURCE: &str = include_str!("../../../examples/c/pingpong.c");
const C_COMMON: &str = include_str!("../../../examples/c/common.h");
const C_HEADER: &str = include_str!("../../rackwire-ffi/include/rackwire.h");
const PY_SOURCE: &str = include_str!("../../../examples/python/pingpong.py");

fn lookup(f: &Fabric, name: &str) -> Result<rackwire::RemoteRegion> {
    let deadline = Instant::now() + STEP;
    loop {
        match f.lookup(name) {
            Ok(h) => return Ok(h),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e.into()),
        }
    }
}

fn expect_msg(f: &Fabric, want: &[u8]) -> Result<u32> {
    let m = f.recv_timeout(STEP)?;
    if m.data != want {
        bail!("expected {:?}, got {:?}", String::from_utf8_lossy(want), String::from_utf8_lossy(&m.data));
    }
    Ok(m.from)
}

/// The Rust side of the protocol (`rackwire lang-worker ROLE ITERS`).
pub fn worker(role: &str, iters: u64) -> Result<()> {
    let f = Fabric::join(FabricConfig::from_env()?)?;
    match role {
        "server" | "client" => {
            let server = role == "server";
            let mine = f.alloc(4096, Access::READ | Access::WRITE)?;
            mine.publish(if server { "c-pingpong/server" } else { "c-pingpong/client" })?;
            let peer = lookup(&f, if server { "c-pingpong/client" } else { "c-pingpong/server" })?;
            mine.grant(peer.node(), Access::WRITE)?;
            let c = f.connect(peer.node())?;
            c.send(b"granted").wait()?;
            expect_msg(&f, b"granted")?;
            let t0 = Instant::now();
            for i in 0..iters {
                if !server {
                    c.write(&peer, 0, &i.to_le_bytes(), OpFlags::NONE.notify(i)).wait()?;
                }
                let n = f.wait_notification(STEP)?;
                let got = mine.load_u64(0)?;
                if n.imm != i || got != i {
                    bail!("round {i}: notified {}, found {got}", n.imm);
                }
                if server {
                    c.write(&peer, 0, &i.to_le_bytes(), OpFlags::NONE.notify(i)).wait()?;
                }
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
            if !server {
                println!("pingpong {iters} rounds, one-way latency {us:.3} us");
            }
            c.send(b"bye").wait()?;
            expect_msg(&f, b"bye")?;
        }
        "bw-server" => {
            let r = f.alloc(BW_BYTES as u64, Access::READ | Access::WRITE)?;
            r.publish("lang-bw/server")?;
            let from = expect_msg(&f, b"hello")?;
            r.grant(from, Access::WRITE)?;
            f.connect(from)?.send(b"granted").wait()?;
            expect_msg(&f, b"done")?;
        }
        "bw-client" => {
            let t = lookup(&f, "lang-bw/server")?;
            let c = f.connect(t.node())?;
            c.send(b"hello").wait()?;
            expect_msg(&f, b"granted")?;
            let data = vec![1u8; BW_BYTES];
            c.write(&t, 0, &data, OpFlags::NONE).wait()?; // warm-up: the mapping is made
            let t0 = Instant::now();
            for _ in 0..iters {
                c.write(&t, 0, &data, OpFlags::NONE).wait()?;
            }
            let mbs = (BW_BYTES as u64 * iters) as f64 / t0.elapsed().as_secs_f64() / 1e6;
            println!("bandwidth {iters} writes of {BW_BYTES} bytes, {mbs:.1} MB/s");
            c.send(b"done").wait()?;
        }
        other => bail!("unknown role {other:?}"),
    }
    Ok(())
}

/// How to start one side in one language.
enum Lang {
    Rust(PathBuf),
    C(PathBuf),
    Python(PathBuf),
}

impl Lang {
    fn name(&self) -> &'static str {
        match self {
            Lang::Rust(_) => "rust",
            Lang::C(_) => "c",
            Lang::Python(_) => "python",
        }
    }

    fn command(&self, role: &str, iters: u64) -> Command {
        let mut c = match self {
            Lang::Rust(exe) => {
                let mut c = Command::new(exe);
                c.arg(crate::spawn::LANG_WORKER);
                c
            }
            Lang::C(exe) => Command::new(exe),
            Lang::Python(script) => {
                let mut c = Command::new("python3");
                c.arg(script);
                c
            }
        };
        c.args([role, &iters.to_string()]);
        c
    }
}

/// Run a server and a client of `lang` once; the client's printed figure.
fn pair(lang: &Lang, mh: &str, secret: &str, roles: (&str, &str), iters: u64, tag: &str) -> Result<f64> {
    let env = |c: &mut Command, name: String| {
        crate::spawn::on_fabric(c, mh, secret, Some(&name)).stdout(Stdio::piped()).stderr(Stdio::piped());
    };
    let mut s = lang.command(roles.0, iters);
    env(&mut s, format!("{tag}-server"));
    let server = s.spawn().with_context(|| format!("starting the {} server", lang.name()))?;
    let mut c = lang.command(roles.1, iters);
    env(&mut c, format!("{tag}-client"));
    let client = c.spawn().with_context(|| format!("starting the {} client", lang.name()))?.wait_with_output()?;
    let server = server.wait_with_output()?;
    let out = String::from_utf8_lossy(&client.stdout).into_owned();
    if !client.status.success() || !server.status.success() {
        // The C library and the Python package are built apart from this executable: one
        // built from older sources may not speak to this build's management host.
        let stale = match lang.name() {
            "c" => "\n(is the C library current? `cargo build --release -p rackwire-ffi`)",
            "python" => "\n(is the Python package current? `pip install ./bindings/python`)",
            _ => "",
        };
        bail!(
            "the {} pair failed:\n{out}{}{}{stale}",
            lang.name(),
            String::from_utf8_lossy(&client.stderr),
            String::from_utf8_lossy(&server.stderr)
        );
    }
    // "... latency X us" or "... , X MB/s": the number before the unit.
    let words: Vec<&str> = out.split_whitespace().collect();
    let figure = words
        .windows(2)
        .find(|w| w[1] == "us" || w[1] == "MB/s")
        .and_then(|w| w[0].parse().ok())
        .with_context(|| format!("no figure in {out:?}"))?;
    Ok(figure)
}

/// The C program, compiled here against the static library beside this executable.
fn build_c(dir: &Path) -> Result<PathBuf> {
    let exe = crate::spawn::own_exe()?;
    let libdir = exe.parent().context("own folder")?;
    let lib = libdir.join("librackwire_ffi.a");
    if !lib.exists() {
        bail!("{} is missing: build it with `cargo build --release -p rackwire-ffi`", lib.display());
    }
    std::fs::write(dir.join("pingpong.c"), C_SOURCE)?;
    std::fs::write(dir.join("common.h"), C_COMMON)?;
    std::fs::write(dir.join("rackwire.h"), C_HEADER)?;
    let out = dir.join("pingpong");
    let o = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-std=c11", "-D_POSIX_C_SOURCE=200809L", "-O2", "-I"])
        .arg(dir)
        .arg(dir.join("pingpong.c"))
        .arg(&lib)
        .args(["-lpthread", "-ldl", "-lm", "-lrt", "-o"])
        .arg(&out)
        .output()
        .context("no C compiler (cc)")?;
    if !o.status.success() {
        bail!("cc failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    Ok(out)
}

/// `rackwire bench lang`.
pub fn run(iters: u64, bw_iters: u64, repeat: usize, json: bool) -> Result<()> {
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    let dir = std::env::temp_dir().join(format!("rackwire-lang-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut langs = vec![Lang::Rust(crate::spawn::own_exe()?)];
    let mut notes = Vec::new();
    match build_c(&dir) {
        Ok(exe) => langs.push(Lang::C(exe)),
        Err(e) => notes.push(format!("C rows skipped: {e:#}")),
    }
    let py = dir.join("pingpong.py");
    std::fs::write(&py, PY_SOURCE)?;
    let have_py =
        Command::new("python3").args(["-c", "import rackwire, numpy"]).output().is_ok_and(|o| o.status.success());
    if have_py {
        langs.push(Lang::Python(py));
    } else {
        notes.push("Python rows skipped: `pip install ./bindings/python numpy` first".into());
    }
    let secret = format!("{:032x}", rackwire_mh::auth::random_u128());
    let mh = rackwire::ManagementHost::start("127.0.0.1:0", None, secret.as_bytes())?;
    let addr = mh.addr().to_string();
    // (lang, pattern) -> each repeat's figure; the languages alternate within each repeat.
    let mut got: Vec<(&'static str, &'static str, Vec<f64>)> = Vec::new();
    for rep in 0..repeat {
        for (k, lang) in langs.iter().enumerate() {
            let tag = format!("lang{rep}-{k}");
            let lat = pair(lang, &addr, &secret, ("server", "client"), iters, &format!("{tag}-pp"))?;
            push(&mut got, lang.name(), "pingpong", lat);
            if !matches!(lang, Lang::C(_)) {
                let bw = pair(lang, &addr, &secret, ("bw-server", "bw-client"), bw_iters, &format!("{tag}-bw"))?;
                push(&mut got, lang.name(), "oneway", bw);
            }
        }
    }
    mh.stop();
    let _ = std::fs::remove_dir_all(&dir);
    let rust = |pattern: &str| got.iter().find(|(l, p, _)| *l == "rust" && *p == pattern).map(|(_, _, v)| v.clone());
    let mut rows = Vec::new();
    for (lang, pattern, v) in &got {
        // Ratio per repeat (same repeat, alternated runs), then its median and spread.
        let mut ratios: Vec<f64> =
            rust(pattern).map(|r| r.iter().zip(v).map(|(r, x)| x / r).collect()).unwrap_or_default();
        let (ratio, ratio_lo, ratio_hi) = median_spread(&mut ratios);
        let (med, lo, hi) = median_spread(&mut v.clone());
        let (key, unit) = if *pattern == "pingpong" { ("lat_us_avg", "µs") } else { ("mb_per_s", "MB/s") };
        rows.push(serde_json::json!({
            "transport": format!("shm-{lang}"), "pattern": pattern, "size": if *pattern == "pingpong" { 8 } else { BW_BYTES },
            key: med, "spread_lo": lo, "spread_hi": hi, "unit": unit, "repeats": v.len(),
            "ratio_to_rust": ratio, "ratio_lo": ratio_lo, "ratio_hi": ratio_hi,
        }));
    }
    if json {
        let doc = serde_json::json!({ "meta": { "command": std::env::args().collect::<Vec<_>>().join(" "), "notes": notes }, "rows": rows });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let mut t = crate::table();
    t.set_header(["language", "pattern", "size", "median", "spread", "vs Rust (spread)"]);
    for r in &rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let v = if r["pattern"] == "pingpong" { f("lat_us_avg") } else { f("mb_per_s") };
        t.add_row([
            r["transport"].as_str().unwrap_or("").trim_start_matches("shm-").to_string(),
            r["pattern"].as_str().unwrap_or("").to_string(),
            crate::show_size(r["size"].as_u64().unwrap_or(0)),
            format!("{v:.3} {}", r["unit"].as_str().unwrap_or("")),
            format!("{:.3}–{:.3}", f("spread_lo"), f("spread_hi")),
            format!("{:.2}x ({:.2}–{:.2})", f("ratio_to_rust"), f("ratio_lo"), f("ratio_hi")),
        ]);
    }
    println!("{t}");
    println!("(ping-pong: mean one-way latency, lower is better; one-way: 1 MiB writes, higher is better)");
    for n in &notes {
        println!("note: {n}");
    }
    Ok(())
}

fn push(got: &mut Vec<(&'static str, &'static str, Vec<f64>)>, lang: &'static str, pattern: &'static str, v: f64) {
    match got.iter_mut().find(|(l, p, _)| *l == lang && *p == pattern) {
        Some((_, _, xs)) => xs.push(v),
        None => got.push((lang, pattern, vec![v])),
    }
}
