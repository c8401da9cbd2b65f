//! What every workload shares: timing in phases separated by barriers, the CPU time the
//! ranks used, and one result per run gathered at rank 0.

use std::time::Instant;

use rackwire_coll::Group;
use serde::{Deserialize, Serialize};

use crate::EvalError;

/// CPU time this process has used so far (every thread), in seconds.
pub fn cpu_secs() -> f64 {
    clock_secs(rustix::time::ClockId::ProcessCPUTime)
}

/// CPU time the calling thread has used so far, in seconds.
pub fn thread_cpu_secs() -> f64 {
    clock_secs(rustix::time::ClockId::ThreadCPUTime)
}

fn clock_secs(clock: rustix::time::ClockId) -> f64 {
    let t = rustix::time::clock_gettime(clock);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// One rank's clock through a run: phases that every rank enters and leaves together (a
/// barrier at each boundary, so a phase's time is the slowest rank's and no phase overlaps
/// the next), and the CPU time used from start to end.
pub struct Phases {
    names: Vec<&'static str>,
    secs: Vec<f64>,
    start: Instant,
    mark: Instant,
    cpu_start: f64,
    /// The machine's busy time at the start (rank 0 only; `None` where `/proc/stat` cannot be
    /// read).
    host_start: Option<rackwire_bench::cpu::MachineCpu>,
}

impl Phases {
    /// Start the clock, together with every rank.
    pub fn start(g: &mut Group) -> Result<Phases, EvalError> {
        g.barrier()?;
        let now = Instant::now();
        let host_start = if g.rank() == 0 { rackwire_bench::cpu::MachineCpu::now() } else { None };
        Ok(Phases { names: Vec::new(), secs: Vec::new(), start: now, mark: now, cpu_start: cpu_secs(), host_start })
    }

    /// End the phase `name` (it began at the end of the one before), together with every rank.
    pub fn end(&mut self, g: &mut Group, name: &'static str) -> Result<(), EvalError> {
        g.barrier()?;
        let now = Instant::now();
        self.names.push(name);
        self.secs.push((now - self.mark).as_secs_f64());
        self.mark = now;
        Ok(())
    }

    /// Stop the clock and gather every rank's times at every rank: the run's result (the
    /// caller fills in what the workload moved and whether its output was right).
    pub fn finish(self, g: &mut Group) -> Result<RunResult, EvalError> {
        let wall = (self.mark - self.start).as_secs_f64();
        let cpu = cpu_secs() - self.cpu_start;
        // Rank 0's machine: the whole virtual rack when it runs on this machine, with the
        // agents, the kernels' network work and the links between the hosts. Read at the last
        // barrier's end, as the phases' clock stopped.
        let host = self.host_start.and_then(|h| h.busy_since());
        let n = g.size();
        let k = self.secs.len();
        // Per rank: wall, cpu, the machine's busy time (rank 0's; -1 where not read), then each
        // phase.
        let mine: Vec<f64> = [wall, cpu, host.unwrap_or(-1.0)].into_iter().chain(self.secs.iter().copied()).collect();
        let mut all = vec![0f64; n * (k + 3)];
        g.allgather(bytemuck::cast_slice(&mine), bytemuck::cast_slice_mut(&mut all))?;
        let rows: Vec<&[f64]> = all.chunks_exact(k + 3).collect();
        let max_of = |i: usize| rows.iter().map(|r| r[i]).fold(0.0, f64::max);
        Ok(RunResult {
            secs: max_of(0),
            cpu_secs: rows.iter().map(|r| r[1]).sum(),
            host_cpu_secs: rows.first().map(|r| r[2]).filter(|&h| h >= 0.0),
            phases: self
                .names
                .iter()
                .enumerate()
                .map(|(i, name)| Phase { name: (*name).into(), secs: max_of(i + 3) })
                .collect(),
            ranks: n,
            bytes: 0,
            work: 0,
            checked: false,
            transport: String::new(),
            rapl_joules: None,
            extra: Default::default(),
        })
    }
}

impl RunResult {
    /// The run's output was checked and found right: what it moved (`bytes`) and did
    /// (`work`), over `transport`.
    pub fn checked(mut self, transport: &str, bytes: u64, work: u64) -> RunResult {
        self.checked = true;
        self.transport = transport.into();
        self.bytes = bytes;
        self.work = work;
        self
    }
}

/// One phase of a run and its time (the slowest rank's).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Phase {
    /// Its name.
    pub name: String,
    /// Seconds.
    pub secs: f64,
}

/// What one run of a workload over one data path gives.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    /// The data path's transport (`shm`, `udp`, `tcp`).
    pub transport: String,
    /// Ranks.
    pub ranks: usize,
    /// Bytes the workload processed (its input).
    pub bytes: u64,
    /// Units of work done (records sorted, records scanned, ...), for work per joule.
    pub work: u64,
    /// Wall-clock seconds from the first phase's start to the last one's end.
    pub secs: f64,
    /// CPU seconds all ranks' processes used meanwhile.
    pub cpu_secs: f64,
    /// Busy core-seconds of the whole machine rank 0 ran on meanwhile (`/proc/stat`): the
    /// ranks, and what carries their data (the kernels' network work, a virtual rack's agents
    /// and links); what the energy model prices. `None` where it could not be read.
    #[serde(default)]
    pub host_cpu_secs: Option<f64>,
    /// Each phase.
    pub phases: Vec<Phase>,
    /// The output was checked and found right.
    pub checked: bool,
    /// Joules the processor's own counters (RAPL) counted over the whole job, where they are
    /// readable: a measurement, beside the model's estimate.
    #[serde(default)]
    pub rapl_joules: Option<f64>,
    /// The workload's own figures (TestDFSIO's rates, YCSB's operations and percentiles).
    #[serde(default)]
    pub extra: std::collections::BTreeMap<String, f64>,
}
