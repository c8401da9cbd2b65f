//! `rackwire rack ...` (the virtual rack) and `rackwire agent` (a host's node agent).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use rackwire::Fabric;
use rackwire_rack::RackConfig;

/// How long an agent keeps trying to join (its management host may still be starting).
const JOIN_RETRY: Duration = Duration::from_secs(10);
/// How often an agent rewrites its status file.
const STATUS_INTERVAL: Duration = Duration::from_millis(250);

/// `rackwire rack`.
#[derive(Subcommand)]
pub(crate) enum RackCmd {
    /// Bring a rack up from its description (TOML; see examples/racks/).
    Up {
        /// The rack description.
        #[arg(long)]
        config: PathBuf,
        /// Print the rack as one JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Take a rack down: its processes, namespaces, links and routes (also after a crash).
    Down {
        /// Which rack (default: the only one up).
        #[arg(long)]
        name: Option<String>,
    },
    /// Hosts, addresses, agents and their virtual NIC counters.
    Status {
        /// Which rack (default: the only one up).
        #[arg(long)]
        name: Option<String>,
        /// One JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in one host of the rack: `rackwire rack exec h1 -- iperf3 -s`.
    Exec {
        /// Host.
        host: String,
        /// Which rack (default: the only one up).
        #[arg(long)]
        name: Option<String>,
        /// The command and its arguments.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
}

/// `rackwire agent`.
#[derive(Args)]
pub(crate) struct AgentArgs {
    /// Write the agent's status (node id, virtual NIC counters) to this file, as JSON.
    #[arg(long)]
    status_file: Option<PathBuf>,
    /// Largest frame on the Ethernet links.
    #[arg(long)]
    link_mtu: Option<usize>,
    /// Join the fabric only; no virtual NIC.
    #[arg(long)]
    no_vnic: bool,
    /// Serve counters (the node's, and rw0's per peer) in the Prometheus text format at
    /// http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

pub(crate) fn run(cmd: RackCmd) -> Result<i32> {
    match cmd {
        RackCmd::Up { config, json } => {
            let text = std::fs::read_to_string(&config).with_context(|| format!("rack config {}", config.display()))?;
            let cfg = RackConfig::parse(&text)?;
            let exe = rackwire_bench::spawn::own_exe()?;
            let state = rackwire_rack::up(&cfg, &exe)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&state)?);
            } else {
                let mut t = rackwire_bench::table();
                t.set_header(["host", "namespace", "addresses", "role", "cores"]);
                for h in &state.hosts {
                    let addrs: Vec<String> = h.addrs.iter().map(|a| a.to_string()).collect();
                    let role = if h.remote {
                        "remote (Ethernet only)".to_string()
                    } else if h.pids.len() > 1 {
                        format!("management host, agent ({})", h.domain)
                    } else {
                        format!("agent ({})", h.domain)
                    };
                    t.add_row([h.name.clone(), h.ns.clone(), addrs.join(" "), role, cores_cell(&h.cores)]);
                }
                println!("{t}");
                println!("rack {} up in {} ms; management host {}", cfg.name, state.up_ms, state.mh);
            }
            Ok(0)
        }
        RackCmd::Down { name } => {
            let r = rackwire_rack::down(name.as_deref())?;
            println!(
                "removed {} namespaces and stopped {} processes in {} ms",
                r.namespaces.len(),
                r.processes,
                r.down_ms
            );
            Ok(0)
        }
        RackCmd::Status { name, json } => {
            let (state, hosts) = rackwire_rack::status(name.as_deref())?;
            if json {
                println!("{}", serde_json::json!({ "rack": state, "hosts": hosts }));
                return Ok(0);
            }
            let mut t = rackwire_bench::table();
            t.set_header(["host", "addresses", "namespace", "running", "node", "cores", "rw0 peers (tx/rx packets)"]);
            for h in &hosts {
                let cores = state.host(&h.name).map_or_else(|_| "?".into(), |s| cores_cell(&s.cores));
                let addrs: Vec<String> = h.addrs.iter().map(|a| a.to_string()).collect();
                let node = h.agent.as_ref().and_then(|a| a.get("node")).map_or("-".into(), |v| v.to_string());
                let peers = h
                    .agent
                    .as_ref()
                    .and_then(|a| a.pointer("/vnic/peers"))
                    .and_then(|p| p.as_array())
                    .map(|ps| {
                        ps.iter()
                            .map(|p| {
                                format!(
                                    "{} {} {}/{}",
                                    p["name"].as_str().unwrap_or("?"),
                                    p["transport"].as_str().unwrap_or("?"),
                                    p["tx_packets"],
                                    p["rx_packets"]
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_else(|| if h.remote { "(Ethernet only)".into() } else { "-".into() });
                t.add_row([
                    h.name.clone(),
                    addrs.join(" "),
                    if h.ns_present { "present" } else { "MISSING" }.into(),
                    if h.running { "yes" } else { "no" }.into(),
                    node,
                    cores,
                    peers,
                ]);
            }
            println!("{t}");
            println!("rack {}: management host {}", state.config.name, state.mh);
            Ok(0)
        }
        RackCmd::Exec { host, name, cmd } => {
            let mut c = rackwire_rack::exec_command(name.as_deref(), &host, &cmd)?;
            let status = c.status().with_context(|| format!("running {}", cmd.join(" ")))?;
            Ok(status.code().unwrap_or(1))
        }
    }
}

/// A host's cores for a table: the list, or `any`.
fn cores_cell(cores: &[usize]) -> String {
    if cores.is_empty() {
        "any".into()
    } else {
        rackwire_rack::cores::cores_text(cores)
    }
}

fn write_status(path: &PathBuf, v: &serde_json::Value) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, v.to_string())?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// A host's node agent: joins the fabric, runs the virtual NIC, reports, stops on SIGTERM or
/// SIGINT (removing its routes).
/// The virtual NIC's counters in the Prometheus text format.
fn rw0_metrics(c: &rackwire_vnic::VnicCounters) -> String {
    use rackwire_metrics::{Kind, Text};
    let mut t = Text::new();
    type Field = fn(&rackwire_vnic::PeerCounters) -> u64;
    let per_peer: [(&str, &str, Field); 5] = [
        ("tx_packets", "packets sent to the peer", |p| p.tx_packets),
        ("tx_bytes", "bytes sent to the peer", |p| p.tx_bytes),
        ("rx_packets", "packets received from the peer", |p| p.rx_packets),
        ("rx_bytes", "bytes received from the peer", |p| p.rx_bytes),
        ("tx_errors", "packets to the peer the fabric did not take", |p| p.tx_errors),
    ];
    for (field, help, get) in per_peer {
        let name = format!("rackwire_rw0_{field}_total");
        t.family(&name, Kind::Counter, &format!("Virtual NIC {}: {help}.", c.ifname));
        for p in &c.peers {
            t.sample(&name, &[("peer", &p.node.to_string()), ("transport", &p.transport)], get(p) as f64);
        }
    }
    t.single("rackwire_rw0_no_route_total", Kind::Counter, "Packets for an address no peer owns.", c.no_route as f64);
    t.single(
        "rackwire_rw0_malformed_total",
        Kind::Counter,
        "Packets that are not well-formed IPv4.",
        c.malformed as f64,
    );
    for (name, help, v) in [
        ("rackwire_rw0_rx_unrouted_total", "Packets from nodes not routed (yet).", c.rx_unrouted),
        ("rackwire_rw0_rx_spoofed_total", "Packets from a peer not from its own address (dropped).", c.rx_spoofed),
        (
            "rackwire_rw0_rx_bad_offload_total",
            "Packets with an offload header out of bounds (dropped).",
            c.rx_bad_offload,
        ),
        ("rackwire_rw0_addr_refused_total", "Addresses peers registered that are not routed.", c.addr_refused),
    ] {
        t.single(name, Kind::Counter, help, v as f64);
    }
    t.finish()
}

pub(crate) fn agent(a: AgentArgs, fabric_args: &crate::FabricArgs) -> Result<()> {
    let mut cfg = fabric_args.resolve("agent")?;
    if let Some(m) = a.link_mtu {
        cfg.link_mtu = m;
    }
    // The virtual NIC's threads sleep in the kernel between packets unless told otherwise
    // (see `rackwire_vnic::BUSY_POLL`); a busy poll set explicitly stands.
    if !a.no_vnic && cfg.busy_poll == rackwire::BUSY_POLL_DEFAULT {
        cfg.busy_poll = rackwire_vnic::BUSY_POLL;
    }
    let deadline = Instant::now() + JOIN_RETRY;
    let fabric = loop {
        match Fabric::join(cfg.clone()) {
            Ok(f) => break Arc::new(f),
            Err(e @ rackwire::Error::Config(_)) => return Err(e.into()),
            Err(e) if Instant::now() > deadline => bail!("could not join the fabric at {}: {e}", cfg.mh),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("signal handler")?;
    }
    let vnic = if a.no_vnic {
        None
    } else {
        let links: Vec<String> =
            fabric.nodes()?.into_iter().find(|n| n.info.id == fabric.id()).map(|n| n.info.links).unwrap_or_default();
        Some(rackwire_vnic::Vnic::start(fabric.clone(), if links.is_empty() { &cfg.links } else { &links }, &cfg.mh)?)
    };
    let vnic = vnic.map(Arc::new);
    let _exporter = match &a.metrics {
        Some(addr) => {
            let (f, v) = (Arc::downgrade(&fabric), vnic.as_ref().map(Arc::downgrade));
            let render = move || {
                let mut page = f.upgrade().map(|f| f.metrics()).unwrap_or_default();
                if let Some(v) = v.as_ref().and_then(std::sync::Weak::upgrade) {
                    page.push_str(&rw0_metrics(&v.counters()));
                }
                page
            };
            Some(
                rackwire_metrics::Exporter::start(addr, Arc::new(render))
                    .with_context(|| format!("metrics address {addr}"))?,
            )
        }
        None => None,
    };
    eprintln!("agent {} (node {}) up{}", fabric.name(), fabric.id(), if vnic.is_some() { ", rw0 up" } else { "" });
    while !stop.load(Ordering::Relaxed) {
        if let Some(path) = &a.status_file {
            let v = serde_json::json!({
                "ready": true,
                "node": fabric.id(),
                "name": fabric.name(),
                "pid": std::process::id(),
                "vnic": vnic.as_ref().map(|v| v.counters()),
            });
            if let Err(e) = write_status(path, &v) {
                eprintln!("agent: status file {}: {e}", path.display());
            }
        }
        std::thread::sleep(STATUS_INTERVAL);
    }
    if let Some(v) = vnic {
        v.stop();
    }
    if let Some(path) = &a.status_file {
        let _ = std::fs::remove_file(path);
    }
    eprintln!("agent {} stopped", fabric.name());
    Ok(())
}
