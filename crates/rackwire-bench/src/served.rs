//! `rackwire bench served`: what a served region costs over shared memory. Two nodes in this
//! process share memory; the owner has a mapped region and a served one
//! ([`rackwire::Fabric::alloc_served`]) of the same size, both granted to the peer, which
//! reads 64 B, writes 64 B, fetch-and-adds and reads 1 MiB on each, the two kinds alternated
//! within every repeat so both see the same machine. Given per repeat as the served figure
//! over the mapped one, median and spread.

use std::time::{Duration, Instant};

use crate::repeat::median_spread;
use anyhow::{bail, Result};
use rackwire::{Access, Conn, Fabric, FabricConfig, ManagementHost, OpFlags, RemoteRegion};

/// Repeats at most.
const REPEAT_MAX: usize = 50;
/// Small operations timed per kind and repeat (at full scale).
const SMALL_OPS: f64 = 20_000.0;
/// 1 MiB reads per kind and repeat (at full scale).
const LARGE_OPS: f64 = 200.0;
const SMALL_BYTES: u64 = 64;
const LARGE_BYTES: u64 = 1 << 20;
const REGION_BYTES: u64 = 2 << 20;
const SECRET: &str = "rackwire-bench-served";

/// One kind's figures in one repeat: p50 µs of the small read, write and fetch-and-add, and
/// the 1 MiB read's MB/s.
#[derive(Clone, Copy)]
struct Figures {
    read_us: f64,
    write_us: f64,
    fadd_us: f64,
    read_mb_s: f64,
}

fn p50_us(n: u64, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    let mut lat = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let t = Instant::now();
        op()?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(median_spread(&mut lat).0)
}

fn measure(conn: &Conn, h: &RemoteRegion, scale: f64) -> Result<Figures> {
    let small = ((SMALL_OPS * scale) as u64).max(10);
    let large = ((LARGE_OPS * scale) as u64).max(3);
    let data = [0x5au8; SMALL_BYTES as usize];
    let read_us = p50_us(small, || Ok(conn.read(h, 64, SMALL_BYTES, OpFlags::NONE).wait().map(drop)?))?;
    let write_us = p50_us(small, || Ok(conn.write(h, 64, &data, OpFlags::NONE).wait().map(drop)?))?;
    let fadd_us = p50_us(small, || Ok(conn.fetch_add(h, 0, 1, OpFlags::NONE).wait().map(drop)?))?;
    let t = Instant::now();
    for _ in 0..large {
        conn.read(h, 0, LARGE_BYTES, OpFlags::NONE).wait()?;
    }
    let read_mb_s = (large * LARGE_BYTES) as f64 / t.elapsed().as_secs_f64() / 1e6;
    Ok(Figures { read_us, write_us, fadd_us, read_mb_s })
}

/// `rackwire bench served`.
pub fn run(repeat: usize, scale: f64, json: bool) -> Result<()> {
    if !(1..=REPEAT_MAX).contains(&repeat) {
        bail!("--repeat must be 1..={REPEAT_MAX}");
    }
    let mh = ManagementHost::start("127.0.0.1:0", None, SECRET.as_bytes())?;
    let join = |name: &str| {
        let mut cfg = FabricConfig::new(mh.addr().to_string(), SECRET, name.to_string());
        cfg.op_timeout = Duration::from_secs(30);
        Fabric::join(cfg)
    };
    let owner = join("served-bench-owner")?;
    let peer = join("served-bench-peer")?;
    let mapped = owner.alloc(REGION_BYTES, Access::ALL)?;
    let served = owner.alloc_served(REGION_BYTES, Access::ALL)?;
    for r in [&mapped, &served] {
        r.grant(peer.id(), Access::ALL)?;
    }
    let conn = peer.connect(owner.id())?;
    if conn.transport() != "shm" {
        bail!("the two nodes did not connect over shared memory (over {})", conn.transport());
    }
    // Per repeat: (mapped, served), the order swapped every other repeat.
    let mut runs = Vec::new();
    for rep in 0..repeat {
        let (first, second) = if rep % 2 == 0 { (&mapped, &served) } else { (&served, &mapped) };
        let a = measure(&conn, &first.handle(), scale)?;
        let b = measure(&conn, &second.handle(), scale)?;
        runs.push(if rep % 2 == 0 { (a, b) } else { (b, a) });
    }
    type Pick = fn(&Figures) -> f64;
    let rows: [(&str, Pick, usize); 4] = [
        ("64 B read, p50 µs", |f| f.read_us, 2),
        ("64 B write, p50 µs", |f| f.write_us, 2),
        ("fetch-and-add, p50 µs", |f| f.fadd_us, 2),
        ("1 MiB read, MB/s", |f| f.read_mb_s, 0),
    ];
    let col = |g: &dyn Fn(&(Figures, Figures)) -> f64| median_spread(&mut runs.iter().map(g).collect::<Vec<_>>());
    let triple = |t: (f64, f64, f64)| serde_json::json!({ "median": t.0, "lo": t.1, "hi": t.2 });
    let fmt = |t: (f64, f64, f64), d: usize| format!("{:.*} ({:.*}–{:.*})", d, t.0, d, t.1, d, t.2);
    let mut doc = serde_json::Map::new();
    let mut table = crate::table();
    table.set_header(["shared memory, one peer", "mapped", "served", "served / mapped"]);
    for (name, pick, digits) in rows {
        let m = col(&|r| pick(&r.0));
        let s = col(&|r| pick(&r.1));
        let ratio = col(&|r| pick(&r.1) / pick(&r.0));
        doc.insert(
            name.into(),
            serde_json::json!({ "mapped": triple(m), "served": triple(s), "ratio": triple(ratio) }),
        );
        table.add_row([name.to_string(), fmt(m, digits), fmt(s, digits), fmt(ratio, 2)]);
    }
    if json {
        doc.insert("meta".into(), serde_json::json!({ "repeats": repeat, "scale": scale }));
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    println!("{table}");
    println!("({repeat} repeats, mapped and served alternated; per repeat, median and spread)");
    Ok(())
}
