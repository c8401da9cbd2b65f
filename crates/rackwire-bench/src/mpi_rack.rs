//! Open MPI across a virtual rack's hosts, started as a cluster's users start it: mpirun runs
//! in the first host and starts one daemon per host through its rsh launcher, whose "ssh" here
//! is a script that runs the command in that host's namespace; ranks go in blocks over the
//! hosts, as `rackwire launch --rack` places ours.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use rackwire_rack::RackState;

/// A rack's hosts as Open MPI sees them.
pub struct MpiRack {
    /// Namespace mpirun runs in.
    ns: String,
    /// The launcher script.
    agent: PathBuf,
    /// Host names in rack order.
    hosts: Vec<String>,
}

impl MpiRack {
    /// The launcher for `state`'s hosts, its script in `dir`. With `fabric`, each host's daemon,
    /// and so each rank it starts, gets that host's fabric settings (its rails, its memory
    /// domain, the management host: what the rackwire provider joins with).
    pub fn new(state: &RackState, dir: &Path, fabric: bool) -> Result<MpiRack> {
        let hosts = rackwire_rack::place::rank_hosts(state);
        let agent = dir.join(if fabric { "rsh-agent-fabric" } else { "rsh-agent" });
        let prefix = rackwire_rack::ns_name(&state.config.name, "");
        let mut env = String::new();
        if fabric {
            env.push_str("case $host in\n");
            for h in &hosts {
                let vars: Vec<String> =
                    rackwire_rack::program_env(state, h).iter().map(|(k, v)| format!("{k}='{v}'")).collect();
                env.push_str(&format!("  {}) export {} ;;\n", h.name, vars.join(" ")));
            }
            env.push_str("esac\n");
        }
        // Every host's daemon gets a session directory of its own: the namespaces share one
        // hostname and one /tmp, and two daemons creating the same directory at once made one
        // of them fail to start now and then.
        let tmp = dir.join("ompi-tmp");
        let script = format!(
            "#!/bin/sh\nhost=$1; shift\nmkdir -p {tmp}/$host\n{env}\
             exec ip netns exec {prefix}$host env OMPI_MCA_orte_tmpdir_base={tmp}/$host sh -c \"$*\"\n",
            tmp = tmp.display()
        );
        std::fs::write(&agent, script)?;
        std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        Ok(MpiRack { ns: hosts[0].ns.clone(), agent, hosts: hosts.iter().map(|h| h.name.clone()).collect() })
    }

    /// `mpirun` for `ranks` ranks placed as ours are, its control traffic on the rails
    /// (198.18.0.0/15); the caller picks the transports.
    pub fn mpirun(&self, ranks: usize) -> Command {
        let mut per = vec![0usize; self.hosts.len()];
        for r in 0..ranks {
            per[rackwire_rack::place::block_place(r, ranks, self.hosts.len()).0] += 1;
        }
        let hosts: Vec<String> =
            self.hosts.iter().zip(&per).filter(|(_, &k)| k > 0).map(|(h, k)| format!("{h}:{k}")).collect();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, "mpirun", "--host", &hosts.join(",")])
            .args(["--mca", "plm_rsh_agent"])
            .arg(&self.agent)
            .args(["--mca", "oob_tcp_if_include", "198.18.0.0/15"])
            // The daemons' topology sharing (hwloc shared memory) now and then crashes a
            // daemon started this way; it only serves process binding, which ranks that
            // share two cores do not get anyway.
            .args(["--mca", "rtc", "^hwloc"]);
        c
    }

    /// [`MpiRack::mpirun`] with MPI traffic on TCP only (`btl tcp,self`) over every rail (every
    /// 198.18.0.0/15 interface, so Open MPI stripes over the rails as over several NICs).
    pub fn mpirun_tcp(&self, ranks: usize) -> Command {
        let mut c = self.mpirun(ranks);
        c.args(["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "198.18.0.0/15"]);
        c
    }
}
