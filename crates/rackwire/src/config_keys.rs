//! The configuration file's keys, each with its type, default, environment variable and
//! meaning: the one list the reference page is made from (`rackwire config reference`,
//! `docs/config.md`), held by a test to the keys the file's reader takes.

use std::time::Duration;

use crate::config::{BUSY_POLL_DEFAULT, CONFIG_PATH_DEFAULT, LINK_MTU_DEFAULT};
use crate::{OP_TIMEOUT_DEFAULT, PEER_TIMEOUT_DEFAULT};

/// One key of the configuration file.
pub struct ConfigKey {
    /// The table it is in (`""`: the top level).
    pub table: &'static str,
    /// Its name.
    pub key: &'static str,
    /// What its value is.
    pub kind: &'static str,
    /// Its value when the file does not set it.
    pub default: fn() -> String,
    /// What else sets it: the environment variable (over the file) or the command's flag.
    pub also: Also,
    /// What it means.
    pub meaning: &'static str,
    /// A value it may take (TOML), for the page and the test that reads them all.
    pub example: &'static str,
}

fn none() -> String {
    "none".into()
}

fn ms(d: Duration) -> String {
    d.as_millis().to_string()
}

/// What sets a key besides the file.
#[derive(Clone, Copy, Debug)]
pub enum Also {
    /// An environment variable (one of [`crate::vars`]), and how its value is written when
    /// that differs from the file's (`""`: the same).
    Env(&'static str, &'static str),
    /// A flag of the command that reads the key.
    Flag(&'static str),
}

impl std::fmt::Display for Also {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Also::Env(var, "") => f.write_str(var),
            Also::Env(var, how) => write!(f, "{var} ({how})"),
            Also::Flag(flag) => f.write_str(flag),
        }
    }
}

/// Every key of the configuration file.
pub const CONFIG_KEYS: &[ConfigKey] = &[
    ConfigKey {
        table: "",
        key: "mh",
        kind: "string",
        default: none,
        also: Also::Env(crate::vars::MH, ""),
        meaning: "Management host address, `host:port`; several, comma-separated, for hosts on one etcd (one leads, the others stand by).",
        example: "\"198.18.0.1:7700\"",
    },
    ConfigKey {
        table: "",
        key: "secret_file",
        kind: "path",
        default: none,
        also: Also::Env(crate::vars::SECRET_FILE, ""),
        meaning: "File holding the fabric's shared secret; refused unless only its owner may read or write it (`chmod 600`).",
        example: "\"/etc/rackwire/secret\"",
    },
    ConfigKey {
        table: "",
        key: "secret",
        kind: "string",
        default: none,
        also: Also::Env(crate::vars::SECRET, ""),
        meaning: "The secret itself, where a file cannot be used (`secret_file` is safer); too short a secret is refused.",
        example: "\"a-secret-of-enough-length\"",
    },
    ConfigKey {
        table: "",
        key: "name",
        kind: "string",
        default: || "none: the process joins as a transient node, `node-PID-KEY`".into(),
        also: Also::Env(crate::vars::NAME, ""),
        meaning: "This node's name, unique in the fabric; a named node keeps its key pair in `state_dir`, and so its id and grants. Leave it out of a host's file: each program names itself (the agent's unit gives the host name).",
        example: "\"host-a\"",
    },
    ConfigKey {
        table: "",
        key: "mh_keys",
        kind: "list of strings",
        default: || "none: each host's key is pinned at first use, in `state_dir`".into(),
        also: Also::Env(crate::vars::MH_KEYS, "comma-separated"),
        meaning: "The management hosts' public keys (64 hex digits each, as `rackwire mh` prints), the only ones taken.",
        example: "[\"9f2c0e4b7a1d5e8f3c6b9a0d2e5f8c1b4a7d0e3f6c9b2a5d8e1f4c7b0a3d6e9f\"]",
    },
    ConfigKey {
        table: "",
        key: "state_dir",
        kind: "path",
        default: || "`$XDG_STATE_HOME/rackwire`, else `~/.local/state/rackwire`".into(),
        also: Also::Env(crate::vars::STATE_DIR, ""),
        meaning: "What a node keeps across restarts: its key pair (`keys/NAME.key`) and pinned host keys.",
        example: "\"/var/lib/rackwire\"",
    },
    ConfigKey {
        table: "",
        key: "runtime_dir",
        kind: "path",
        default: || "`$TMPDIR/rackwire-UID`".into(),
        also: Also::Env(crate::vars::RUNTIME_DIR, ""),
        meaning: "Where this node's shared-memory endpoint socket lives (one folder for the nodes of one user that share memory).",
        example: "\"/run/rackwire\"",
    },
    ConfigKey {
        table: "",
        key: "transport",
        kind: "`auto`, `shm` or `edge`",
        default: || "auto".into(),
        also: Also::Env(crate::vars::TRANSPORT, ""),
        meaning: "Shared memory for peers on this machine and the edge transport for the rest (`auto`), shared memory only, or the edge transport for every peer.",
        example: "\"auto\"",
    },
    ConfigKey {
        table: "",
        key: "links",
        kind: "list of `ip:port`",
        default: || "none: no edge transport".into(),
        also: Also::Env(crate::vars::LINKS, "comma-separated"),
        meaning: "This node's Ethernet links for the edge transport, one address per rail; port 0 picks one (in a host's file, where every program of the host opens links of its own, leave it 0).",
        example: "[\"198.18.1.2:0\", \"198.18.2.2:0\"]",
    },
    ConfigKey {
        table: "",
        key: "link_mtu",
        kind: "bytes",
        default: || LINK_MTU_DEFAULT.to_string(),
        also: Also::Env(crate::vars::LINK_MTU, ""),
        meaning: "Largest frame on the links: the links' MTU less the IPv4 and UDP headers (28 bytes); 8972 for jumbo frames.",
        example: "1472",
    },
    ConfigKey {
        table: "",
        key: "peer_timeout_ms",
        kind: "milliseconds",
        default: || ms(PEER_TIMEOUT_DEFAULT),
        also: Also::Env(crate::vars::PEER_TIMEOUT_MS, ""),
        meaning: "Edge transport: how long every link to a peer may stay silent before the peer is taken as gone.",
        example: "10000",
    },
    ConfigKey {
        table: "",
        key: "op_timeout_ms",
        kind: "milliseconds",
        default: || ms(OP_TIMEOUT_DEFAULT),
        also: Also::Env(crate::vars::OP_TIMEOUT_MS, ""),
        meaning: "How long an operation may wait for room in a peer's ring or for its peer's answer.",
        example: "15000",
    },
    ConfigKey {
        table: "",
        key: "busy_poll_us",
        kind: "microseconds",
        default: || BUSY_POLL_DEFAULT.as_micros().to_string(),
        also: Also::Env(crate::vars::BUSY_POLL_US, ""),
        meaning: "How long a waiting receiver polls before it sleeps (latency against CPU time).",
        example: "200",
    },
    ConfigKey {
        table: "",
        key: "net_spin_us",
        kind: "microseconds",
        default: || "learned: 50-200".into(),
        also: Also::Env(crate::vars::NET_SPIN_US, ""),
        meaning: "How long the edge transport's network thread looks for frames after work before it sleeps (0: at once; latency against CPU time).",
        example: "0",
    },
    ConfigKey {
        table: "",
        key: "copy_channels",
        kind: "count",
        default: || "2".into(),
        also: Also::Env(crate::vars::COPY_CHANNELS, ""),
        meaning: "Threads that copy a large batch of shared-memory operations (1: the calling thread only).",
        example: "2",
    },
    ConfigKey {
        table: "",
        key: "memory_domain",
        kind: "string",
        default: || "empty: the machine is one domain".into(),
        also: Also::Env(crate::vars::MEMORY_DOMAIN, ""),
        meaning: "Nodes on one machine share memory only when their domains are equal too.",
        example: "\"rack-1\"",
    },
    ConfigKey {
        table: "",
        key: "seal_frames",
        kind: "boolean",
        default: || "true".into(),
        also: Also::Env(crate::vars::SEAL, "on/off"),
        meaning: "Seal edge frames (encrypted, authenticated); they go unsealed only when both ends turn this off.",
        example: "true",
    },
    ConfigKey {
        table: "",
        key: "in_order",
        kind: "boolean",
        default: || "false".into(),
        also: Also::Env(crate::vars::IN_ORDER, "on/off"),
        meaning: "Deliver edge frames to this node in the order they were sent (a frame beyond a gap waits for it), as MultiEdge's ordered links.",
        example: "true",
    },
    ConfigKey {
        table: "",
        key: "private_memory",
        kind: "boolean",
        default: || "true".into(),
        also: Also::Env(crate::vars::PRIVATE_MEMORY, "on/off"),
        meaning: "Close the process's descriptors, and so its regions' memory, to other processes of the same user (no core dumps, no debugger: turn off to debug).",
        example: "true",
    },
    ConfigKey {
        table: "",
        key: "metrics",
        kind: "`ip:port`",
        default: || "none: not served".into(),
        also: Also::Env(crate::vars::METRICS, ""),
        meaning: "Serve this node's counters in the Prometheus text format at `http://ADDR/metrics`.",
        example: "\"127.0.0.1:9470\"",
    },
    ConfigKey {
        table: "",
        key: "faults",
        kind: "string",
        default: none,
        also: Also::Env(crate::vars::FAULTS, ""),
        meaning: "Faults injected on the links' send paths, for tests (`drop=0.01,dup=0.001,seed=7`).",
        example: "\"drop=0.01,seed=7\"",
    },
    ConfigKey {
        table: "management_host",
        key: "listen",
        kind: "`ip:port`",
        default: || "127.0.0.1:7700".into(),
        also: Also::Flag("--listen"),
        meaning: "Address the management host listens on.",
        example: "\"0.0.0.0:7700\"",
    },
    ConfigKey {
        table: "management_host",
        key: "state",
        kind: "path",
        default: none,
        also: Also::Flag("--state"),
        meaning: "Folder of the host's persistent state and key pair (with `etcd`, only the key).",
        example: "\"/var/lib/rackwire/mh\"",
    },
    ConfigKey {
        table: "management_host",
        key: "etcd",
        kind: "string",
        default: none,
        also: Also::Flag("--etcd"),
        meaning: "Keep the state in etcd (endpoints, comma-separated): hosts on one etcd elect one to lead.",
        example: "\"http://198.18.0.1:2379\"",
    },
    ConfigKey {
        table: "management_host",
        key: "fabric",
        kind: "string",
        default: || "default".into(),
        also: Also::Flag("--fabric"),
        meaning: "With `etcd`: the fabric's name (its keys live under `/rackwire/NAME`).",
        example: "\"default\"",
    },
    ConfigKey {
        table: "management_host",
        key: "metrics",
        kind: "`ip:port`",
        default: || "none: not served".into(),
        also: Also::Flag("--metrics"),
        meaning: "Serve the host's counters in the Prometheus text format at `http://ADDR/metrics`.",
        example: "\"127.0.0.1:9469\"",
    },
    ConfigKey {
        table: "management_host",
        key: "forget_after_s",
        kind: "seconds",
        default: || rackwire_mh::FORGET_AFTER_DEFAULT.as_secs().to_string(),
        also: Also::Flag("--forget-after"),
        meaning: "Forget a node down this long: its record, its name, its regions' names and its grants.",
        example: "604800",
    },
    ConfigKey {
        table: "management_host",
        key: "forget_transient_after_s",
        kind: "seconds",
        default: || rackwire_mh::TRANSIENT_FORGET_AFTER_DEFAULT.as_secs().to_string(),
        also: Also::Flag("--forget-transient-after"),
        meaning: "Forget a transient node (a process with no name of its own) down this long.",
        example: "60",
    },
];

/// The reference page of the configuration file (Markdown), made from [`CONFIG_KEYS`].
pub fn reference_markdown() -> String {
    let mut out = format!(
        "# The configuration file\n\n\
         Every rackwire program on a host — the CLI, the agent, the management host, programs on the\n\
         library, the C and Python bindings, the libfabric provider — reads one TOML file:\n\
         `RACKWIRE_CONFIG` when it is set (set empty: no file), else `{CONFIG_PATH_DEFAULT}` when it\n\
         exists. The environment variables override the file, and a command's flags override both.\n\
         `rackwire config check [FILE]` says what is wrong with a file, one line per problem.\n\n\
         This page is made by `rackwire config reference` from the list the reader is tested against.\n"
    );
    for (table, title) in
        [("", "Every program"), ("management_host", "`[management_host]`: what `rackwire mh` runs with")]
    {
        out.push_str(&format!(
            "\n## {title}\n\n| key | value | default | also set by | meaning |\n| --- | --- | --- | --- | --- |\n"
        ));
        for k in CONFIG_KEYS.iter().filter(|k| k.table == table) {
            out.push_str(&format!("| `{}` | {} | {} | `{}` | {} |\n", k.key, k.kind, (k.default)(), k.also, k.meaning));
        }
    }
    out.push_str("\n## An example\n\n```toml\n");
    for table in ["", "management_host"] {
        if !table.is_empty() {
            out.push_str(&format!("\n[{table}]\n"));
        }
        for k in CONFIG_KEYS.iter().filter(|k| k.table == table && k.key != "secret" && k.key != "faults") {
            out.push_str(&format!("{} = {}\n", k.key, k.example));
        }
    }
    out.push_str("```\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{FileConfig, ManagementHostFile};

    /// The keys a reader of type `T` takes, as its refusal of an unknown key lists them.
    fn keys_taken<T: serde::de::DeserializeOwned>() -> Vec<String> {
        let e = toml::from_str::<T>("no_such_key = 1").err().expect("an unknown key is refused");
        let text = e.message().to_string();
        let list = text.split("expected one of").nth(1).expect("the refusal lists the keys");
        list.split('`').skip(1).step_by(2).map(String::from).collect()
    }

    // Checks that the reference lists exactly the keys the reader takes, table by table: the
    // set of keys in CONFIG_KEYS equals the set the reader's refusal of an unknown key names
    // (so a key added to the reader and not to the page, or the reverse, fails here).
    #[test]
    fn reference_lists_exactly_the_keys_read() {
        let listed = |table: &str| {
            let mut v: Vec<String> =
                CONFIG_KEYS.iter().filter(|k| k.table == table).map(|k| k.key.to_string()).collect();
            v.sort();
            v
        };
        let mut top = keys_taken::<FileConfig>();
        top.retain(|k| k != "management_host");
        top.sort();
        assert_eq!(top, listed(""));
        let mut mh = keys_taken::<ManagementHostFile>();
        mh.sort();
        assert_eq!(mh, listed("management_host"));
    }

    // Checks every key's example: a file setting each one (a table per section) is read and
    // loaded without error (values parsed, the fault spec too; the secret file, which does not
    // exist here, left out), so the page shows only values the reader takes.
    #[test]
    fn every_example_is_read() {
        let mut text = String::new();
        for table in ["", "management_host"] {
            if !table.is_empty() {
                text.push_str(&format!("[{table}]\n"));
            }
            for k in CONFIG_KEYS.iter().filter(|k| k.table == table && k.key != "secret_file") {
                text.push_str(&format!("{} = {}\n", k.key, k.example));
            }
        }
        let f: FileConfig = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(f.management_host.and_then(|m| m.listen).as_deref(), Some("0.0.0.0:7700"));
        let path = std::env::temp_dir().join(format!("rw-keys-{}.toml", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let c = crate::FabricConfig::from_file(&path);
        let _ = std::fs::remove_file(&path);
        let c = c.unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert!(c.faults.is_some() && c.links.len() == 2 && c.memory_domain == "rack-1");
    }

    // Checks that docs/config.md is the page the code makes now (compared byte for byte), so the
    // documented keys and defaults cannot drift from the reader.
    #[test]
    fn the_docs_page_is_current() {
        let page = include_str!("../../../docs/config.md");
        assert!(
            page == reference_markdown(),
            "docs/config.md is stale: run `cargo run -p rackwire-cli -- config reference > docs/config.md`"
        );
    }
}
