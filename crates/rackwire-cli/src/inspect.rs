//! `rackwire nodes` and `rackwire regions`: what the management host knows.

use anyhow::Result;
use rackwire_mh::{MhClient, MhConfig, Role};

use crate::FabricArgs;

fn observer(args: &FabricArgs) -> Result<MhClient> {
    let cfg = args.resolve("rackwire-cli")?;
    if cfg.mh.is_empty() {
        anyhow::bail!("no management host address: pass --mh or set RACKWIRE_MH");
    }
    Ok(MhClient::join(MhConfig {
        addr: cfg.mh,
        secret: cfg.secret,
        name: "rackwire-cli".into(),
        role: Role::Observer,
        trust: rackwire_mh::MhTrust::Secret,
        transient: false,
    })?)
}

fn age(last_seen_ms: u64) -> String {
    if last_seen_ms == 0 {
        return "-".into();
    }
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    format!("{:.1}s ago", now.saturating_sub(last_seen_ms) as f64 / 1000.0)
}

pub(crate) fn nodes(args: &FabricArgs, json: bool) -> Result<()> {
    let nodes = observer(args)?.nodes()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "nodes": nodes }))?);
        return Ok(());
    }
    let mut t = rackwire_bench::table();
    t.set_header(["id", "name", "state", "last seen", "pid", "shared-memory endpoint", "links"]);
    for n in &nodes {
        t.add_row([
            n.info.id.to_string(),
            n.info.name.clone(),
            if n.up { "up".into() } else { "down".into() },
            age(n.last_seen_ms),
            n.info.pid.to_string(),
            n.info.shm_path.clone().unwrap_or_else(|| "-".into()),
            if n.info.links.is_empty() { "-".into() } else { n.info.links.join(", ") },
        ]);
    }
    println!("{t}");
    Ok(())
}

pub(crate) fn regions(args: &FabricArgs, json: bool) -> Result<()> {
    let (regions, grants) = observer(args)?.regions()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "regions": regions, "grants": grants }))?);
        return Ok(());
    }
    let mut t = rackwire_bench::table();
    t.set_header(["name", "node", "region", "bytes", "granted to"]);
    for r in &regions {
        let to: Vec<String> = grants
            .iter()
            .filter(|g| g.node == r.node && g.region == r.region)
            .map(|g| format!("{} ({})", g.peer, rackwire::Access::from_bits(g.access)))
            .collect();
        t.add_row([
            r.name.clone(),
            r.node.to_string(),
            r.region.to_string(),
            r.len.to_string(),
            if to.is_empty() { "-".into() } else { to.join(", ") },
        ]);
    }
    println!("{t}");
    let unpublished =
        grants.iter().filter(|g| !regions.iter().any(|r| r.node == g.node && r.region == g.region)).count();
    if unpublished > 0 {
        println!("{unpublished} grant(s) on unpublished regions (see --json)");
    }
    Ok(())
}
