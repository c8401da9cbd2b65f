//! `rackwire mh`: run a management host, with its settings from the flags, else from the
//! configuration file's `[management_host]` table (as the packaged service runs it).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

/// Where a management host listens when neither its flags nor the file say.
const LISTEN_DEFAULT: &str = "127.0.0.1:7700";
/// The fabric's name in etcd when neither its flags nor the file say.
const FABRIC_DEFAULT: &str = "default";

#[derive(Args)]
pub(crate) struct MhArgs {
    /// Address to listen on [default: the file's, else 127.0.0.1:7700].
    #[arg(long)]
    listen: Option<String>,
    /// Folder for the persistent state (created if missing) and the host's key pair; with
    /// --etcd, the state lives in etcd and this folder keeps only the key (without it, the
    /// host has a new key each run, which nodes that pinned the old one refuse).
    #[arg(long)]
    state: Option<PathBuf>,
    /// Keep the state in etcd instead (endpoints, comma-separated): several management
    /// hosts on one etcd elect one to lead, the others stand by (give nodes every host's
    /// address, comma-separated) and take over within seconds when it dies.
    #[arg(long, value_name = "ENDPOINTS")]
    etcd: Option<String>,
    /// With --etcd: the fabric's name (its keys live under /rackwire/NAME) [default: the
    /// file's, else `default`].
    #[arg(long)]
    fabric: Option<String>,
    /// File holding the fabric's shared secret [env: RACKWIRE_SECRET_FILE, or RACKWIRE_SECRET;
    /// else the configuration file's]
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Serve counters in the Prometheus text format at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Forget a node down this many seconds: its record, its name (free for another key
    /// then), its regions' names and the grants to and from it [default: a week].
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    forget_after: Option<u64>,
    /// Forget a transient node (a process with no name of its own, such as a job's rank,
    /// whose key pair died with it) down this many seconds [default: a minute; at most
    /// --forget-after]
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    forget_transient_after: Option<u64>,
    /// Configuration file (TOML) [env: RACKWIRE_CONFIG; default /etc/rackwire/rackwire.toml
    /// when it exists]
    #[arg(long)]
    config: Option<PathBuf>,
}

/// The fabric secret: the flag's file, else the environment's, else the configuration file's.
fn secret(args: &MhArgs, file: Option<&std::path::Path>) -> Result<Vec<u8>> {
    let given = args.secret_file.is_some()
        || std::env::var_os(rackwire::vars::SECRET_FILE).is_some()
        || std::env::var_os(rackwire::vars::SECRET).is_some();
    if given {
        return crate::read_secret(&args.secret_file);
    }
    if let Some(path) = file {
        let secret = rackwire::FabricConfig::from_file(path)?.secret;
        if !secret.is_empty() {
            return Ok(secret);
        }
    }
    bail!("no fabric secret: pass --secret-file, set RACKWIRE_SECRET_FILE or RACKWIRE_SECRET, or give `secret_file` in the configuration file")
}

pub(crate) fn run(args: MhArgs) -> Result<()> {
    let file = args.config.clone().or_else(rackwire::config_path);
    let table = match &file {
        Some(p) => rackwire::ManagementHostFile::read(p)?,
        None => rackwire::ManagementHostFile::default(),
    };
    let secret = secret(&args, file.as_deref())?;
    let listen = args.listen.clone().or(table.listen).unwrap_or_else(|| LISTEN_DEFAULT.into());
    let state = args.state.clone().or(table.state);
    let etcd = args.etcd.clone().or(table.etcd);
    let fabric = args.fabric.clone().or(table.fabric).unwrap_or_else(|| FABRIC_DEFAULT.into());
    let metrics = args.metrics.clone().or(table.metrics);
    let (h, kept) = match (&etcd, &state) {
        (Some(endpoints), _) => {
            if state.is_none() {
                eprintln!(
                    "warning: no state folder for this host's key: it has a new key each run, and nodes \
                     that pinned the old one will refuse it"
                );
            }
            let cfg = rackwire_mh::etcd::EtcdConfig::new(endpoints, &fabric)?;
            let kept = format!("etcd {endpoints} under {}; leads when elected", cfg.prefix);
            (rackwire::ManagementHost::start_led(&listen, cfg, &secret, state.as_deref())?, kept)
        }
        (None, Some(dir)) => (rackwire::ManagementHost::start(&listen, Some(dir), &secret)?, dir.display().to_string()),
        (None, None) => bail!("give --state DIR or --etcd ENDPOINTS (or `state` or `etcd` under [management_host])"),
    };
    if table.forget_after_s == Some(0) || table.forget_transient_after_s == Some(0) {
        bail!("forget_after_s and forget_transient_after_s under [management_host] must be at least 1");
    }
    if let Some(s) = args.forget_transient_after.or(table.forget_transient_after_s) {
        h.set_forget_transient_after(Duration::from_secs(s));
    }
    if let Some(s) = args.forget_after.or(table.forget_after_s) {
        h.set_forget_after(Duration::from_secs(s));
    }
    let exporter = match &metrics {
        Some(addr) => Some(
            rackwire_metrics::Exporter::start(addr, std::sync::Arc::new(h.metrics_source()))
                .with_context(|| format!("metrics address {addr}"))?,
        ),
        None => None,
    };
    // Its key: nodes pin it at first use; give it to them (RACKWIRE_MH_KEYS) to take no other.
    let key = rackwire_mh::auth::to_hex(&h.host_key());
    eprintln!("management host on {} (state in {kept}; key {key})", h.addr());
    if let Some(e) = &exporter {
        eprintln!("metrics on http://{}/metrics", e.addr());
    }
    h.wait();
    Ok(())
}
