//! `rackwire eval dsm`: MultiEdge's application study — SPLASH-2's algorithms over the shared
//! virtual memory of `rackwire-dsm`, a rank per host of a virtual rack, each run timed against
//! the same program in one process on plain memory and checked against that run's result.
//!
//! A run's time is its kernel's (the data set is laid out first, untimed, as SPLASH-2 times
//! its parallel section). Where each rank's kernel time went comes from the shared memory's
//! own clocks ([`rackwire_dsm::Stats`]): waiting for faults (fetches from homes), locks,
//! barriers, the protocol's own work; compute is the rest. Beside them: the CPU the rank's other
//! threads used (the transport's network thread and the fault service: MultiEdge's "protocol
//! CPU"), and the frames the transport sent beyond the data's own (acknowledgements,
//! retransmissions: its "extra traffic").

use std::path::{Path, PathBuf};
use std::time::Instant;

use rackwire_coll::Group;
use rackwire_dsm::apps::{fft, lu, radix, water, Memory, Plain};
use rackwire_dsm::{DsmError, SharedMemory, Stats};

use crate::{EvalError, RunResult};

/// The applications, in the order the report lists them.
pub const APPS: [App; 4] = [App::Fft, App::Lu, App::Radix, App::Water];
/// FFT points at scale 1 (a power of 4).
pub const FFT_POINTS: usize = 1 << 22;
/// LU's matrix side at scale 1.
pub const LU_SIDE: usize = 2048;
/// LU's block side: 32 x 32 numbers are two pages, so no page holds two ranks' blocks.
pub const LU_BLOCK: usize = 32;
/// Radix sort's keys at scale 1, and their bits.
pub const RADIX_KEYS: usize = 8 << 20;
/// Bits of each key (four passes of 8 bits).
pub const RADIX_BITS: u32 = 32;
/// Water's molecules at scale 1, and its time steps.
pub const WATER_MOLECULES: usize = 16384;
/// Water's time steps.
pub const WATER_STEPS: usize = 3;
/// How far a coordinate of Water's may be from the one-process run's, relative (its sums land
/// in another order at another rank count).
const WATER_TOLERANCE: f64 = 1e-9;
/// The largest problem a run takes, in words of shared memory (8 GiB).
const WORDS_MAX: usize = 1 << 30;

/// One of the applications.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum App {
    /// The six-step FFT.
    Fft,
    /// Blocked LU factorisation.
    Lu,
    /// Radix sort.
    Radix,
    /// Water-nsquared-like all-pairs dynamics.
    Water,
}

impl App {
    /// Its name on the command line and in rows.
    pub fn name(self) -> &'static str {
        match self {
            App::Fft => "fft",
            App::Lu => "lu",
            App::Radix => "radix",
            App::Water => "water",
        }
    }

    /// The application named `s`.
    pub fn parse(s: &str) -> Result<App, EvalError> {
        APPS.into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| EvalError::BadArgument(format!("no application {s:?} (fft, lu, radix, water)")))
    }

    /// Its problem size at `scale`: FFT's points (a power of 4), LU's side (a multiple of its
    /// block), Radix's keys, Water's molecules.
    pub fn size(self, scale: f64) -> usize {
        match self {
            App::Fft => {
                // The power of 4 nearest the scaled count.
                let want = (FFT_POINTS as f64 * scale).max(16.0);
                let k = (want.log2() / 2.0).round().max(2.0) as u32;
                1usize << (2 * k)
            }
            App::Lu => ((LU_SIDE as f64 * scale.cbrt()) as usize / LU_BLOCK).max(2) * LU_BLOCK,
            App::Radix => ((RADIX_KEYS as f64 * scale) as usize).max(1024),
            App::Water => ((WATER_MOLECULES as f64 * scale.sqrt()) as usize).max(16),
        }
    }

    /// The problem, in words.
    pub fn describe(self, size: usize) -> String {
        match self {
            App::Fft => format!("2^{} complex points", size.trailing_zeros()),
            App::Lu => format!("{size}x{size} matrix, {LU_BLOCK}x{LU_BLOCK} blocks"),
            App::Radix => format!("{size} keys of {RADIX_BITS} bits"),
            App::Water => format!("{size} molecules, {WATER_STEPS} steps"),
        }
    }

    /// Words of shared memory the problem takes.
    pub fn words(self, size: usize) -> usize {
        match self {
            App::Fft => fft::words(size),
            App::Lu => self.lu_shape(size).words(),
            App::Radix => radix::words(size),
            App::Water => water::words(size),
        }
    }

    fn lu_shape(self, size: usize) -> lu::Shape {
        lu::Shape { n: size, b: LU_BLOCK }
    }

    /// Lay the data set out (each rank its part, then a barrier).
    fn init(self, m: &mut impl Memory, size: usize, seed: u64) -> Result<(), DsmError> {
        match self {
            App::Fft => fft::init(m, size, seed),
            App::Lu => lu::init(m, self.lu_shape(size), seed),
            App::Radix => radix::init(m, size, RADIX_BITS, seed),
            App::Water => water::init(m, size, seed),
        }
    }

    /// Run the kernel; where its result lies (a range of words; Water's positions are read
    /// apart).
    fn kernel(self, m: &mut impl Memory, size: usize) -> Result<std::ops::Range<usize>, DsmError> {
        match self {
            App::Fft => fft::transform(m, size).map(|()| 0..2 * size),
            App::Lu => lu::factorise(m, self.lu_shape(size)).map(|()| 0..self.words(size)),
            App::Radix => radix::sort(m, size, RADIX_BITS).map(|at| at..at + size),
            App::Water => water::simulate(m, size, WATER_STEPS).map(|()| 0..0),
        }
    }

    /// The result as words: the kernel's output range, or Water's positions.
    fn result(self, m: &mut impl Memory, size: usize, at: std::ops::Range<usize>) -> Result<Vec<u64>, DsmError> {
        match self {
            App::Water => Ok(water::positions(m, size)?.into_iter().map(f64::to_bits).collect()),
            _ => at.map(|i| m.word(i)).collect(),
        }
    }

    /// Whether a shared run must match the one-process run bit for bit (else to rounding).
    fn exact(self) -> bool {
        self != App::Water
    }
}

/// The check a one-process run makes of its own result: Radix's keys ascend; FFT keeps
/// Parseval's identity (the output's energy is `n` times the input's); every number is finite.
fn self_check(app: App, size: usize, input_energy: f64, out: &[u64]) -> Result<(), EvalError> {
    let wrong = |what: String| Err(EvalError::WrongOutput(format!("{}: {what}", app.name())));
    match app {
        App::Radix => {
            if let Some(i) = out.windows(2).position(|w| w[0] > w[1]) {
                return wrong(format!("key {i} is above the next"));
            }
        }
        _ => {
            if let Some(i) = out.iter().position(|w| !f64::from_bits(*w).is_finite()) {
                return wrong(format!("number {i} is not finite"));
            }
        }
    }
    if app == App::Fft {
        let energy: f64 = out.iter().map(|w| f64::from_bits(*w).powi(2)).sum();
        let want = input_energy * size as f64;
        if (energy - want).abs() > 1e-6 * want {
            return wrong(format!("output energy {energy} against n times the input's, {want}"));
        }
    }
    Ok(())
}

/// The file a one-process run leaves its result in, for the shared runs to be checked against.
pub fn reference_file(dir: &Path, app: App, size: usize, seed: u64) -> PathBuf {
    dir.join(format!("dsm-{}-{size}-{seed}.want", app.name()))
}

fn to_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn check_sizes(app: App, size: usize) -> Result<(), EvalError> {
    let words = app.words(size);
    if words == 0 || words > WORDS_MAX {
        return Err(EvalError::BadArgument(format!(
            "{}: {} takes {words} words (1..={WORDS_MAX})",
            app.name(),
            app.describe(size)
        )));
    }
    Ok(())
}

fn dsm(e: DsmError) -> EvalError {
    EvalError::WrongOutput(format!("shared memory: {e}"))
}

/// One process on plain memory: the kernel's time, the result checked by its own means and
/// left in `dir` for the shared runs.
pub fn run_plain(app: App, size: usize, seed: u64, dir: &Path) -> Result<RunResult, EvalError> {
    check_sizes(app, size)?;
    let mut m = Plain::zeroed(app.words(size));
    app.init(&mut m, size, seed).map_err(dsm)?;
    let input_energy: f64 =
        if app == App::Fft { m.0[..2 * size].iter().map(|w| f64::from_bits(*w).powi(2)).sum() } else { 0.0 };
    let (cpu0, start) = (crate::job::cpu_secs(), Instant::now());
    let at = app.kernel(&mut m, size).map_err(dsm)?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = crate::job::cpu_secs() - cpu0;
    let out = app.result(&mut m, size, at).map_err(dsm)?;
    self_check(app, size, input_energy, &out)?;
    let file = reference_file(dir, app, size, seed);
    std::fs::write(&file, to_bytes(&out)).map_err(|e| EvalError::Io(format!("{}: {e}", file.display())))?;
    let mut r = blank(1, secs, cpu);
    r.extra.insert("compute_s".into(), secs);
    Ok(r.checked("plain", (app.words(size) * 8) as u64, size as u64))
}

fn blank(ranks: usize, secs: f64, cpu: f64) -> RunResult {
    RunResult {
        transport: String::new(),
        ranks,
        bytes: 0,
        work: 0,
        secs,
        cpu_secs: cpu,
        host_cpu_secs: None,
        phases: Vec::new(),
        checked: false,
        rapl_joules: None,
        extra: Default::default(),
    }
}

/// What a rank reports of its kernel, in this order: times (`secs`, `*_s`: the rows give
/// their mean over the ranks) and counts (summed; `cpu` is its process's CPU seconds).
const REPORT: [&str; 19] = [
    "secs",
    "cpu",
    "data_wait_s",
    "fetch_s",
    "lock_s",
    "barrier_s",
    "protocol_s",
    "other_threads_cpu_s",
    "faults",
    "fetches",
    "diffs",
    "diff_bytes",
    "locks",
    "barriers",
    "data_frames",
    "frames_sent",
    "retransmits",
    "out_of_order",
    "held",
];

/// The edge transport's frame counters summed over this rank's connections:
/// data frames, all frames, retransmissions, frames beyond a gap, frames that waited for it.
fn frames(g: &Group) -> [f64; 5] {
    let mut f = [0f64; 5];
    for r in 0..g.size() {
        if let Some(e) = g.conn(r).and_then(|c| c.stats().edge) {
            f[0] += e.data_frames as f64;
            f[1] += e.frames_sent as f64;
            f[2] += e.retransmits as f64;
            f[3] += e.out_of_order as f64;
            f[4] += e.held as f64;
        }
    }
    f
}

/// One rank of a shared run: lay out, time the kernel, gather every rank's breakdown at every
/// rank, and (rank 0) check the result against the one-process run's in `dir`.
pub fn run_shared(g: Group, app: App, size: usize, seed: u64, dir: &Path) -> Result<RunResult, EvalError> {
    check_sizes(app, size)?;
    let mut m = SharedMemory::new(g, app.words(size) * 8).map_err(dsm)?;
    // The ranks are processes of their own here: every rank's view of the range sits at one
    // address (a pointer into it means the same word at every rank), or the run says so.
    let addr = m.range().as_ptr() as u64;
    let mut addrs = vec![0u64; m.size()];
    m.group().allgather(&addr.to_le_bytes(), bytemuck::cast_slice_mut(&mut addrs))?;
    if addrs.iter().any(|&a| a != addr) {
        return Err(EvalError::WrongOutput(format!("the ranks' views of the shared range are at {addrs:#x?}")));
    }
    app.init(&mut m, size, seed).map_err(dsm)?;
    let next = (m.rank() + 1) % m.size();
    let transport = m.group().conn(next).map(|c| c.transport().to_string());
    let (s0, f0) = (m.stats(), frames(m.group()));
    m.group().barrier()?;
    let (cpu0, tcpu0, start) = (crate::job::cpu_secs(), crate::job::thread_cpu_secs(), Instant::now());
    let at = app.kernel(&mut m, size).map_err(dsm)?;
    // The kernel ends with the shared memory's barrier: every rank's writes are at their homes.
    m.group().barrier()?;
    let secs = start.elapsed().as_secs_f64();
    let cpu = crate::job::cpu_secs() - cpu0;
    let other_cpu = cpu - (crate::job::thread_cpu_secs() - tcpu0);
    let s: Stats = m.stats().since(&s0);
    let f1 = frames(m.group());
    let c = s.counters;
    let mine: [f64; REPORT.len()] = [
        secs,
        cpu,
        s.data_wait.as_secs_f64(),
        s.fetch.as_secs_f64(),
        s.lock_wait.as_secs_f64(),
        s.barrier_wait.as_secs_f64(),
        s.protocol.as_secs_f64(),
        other_cpu.max(0.0),
        c.faults as f64,
        c.fetches as f64,
        c.diffs as f64,
        c.diff_bytes as f64,
        s.locks as f64,
        s.barriers as f64,
        f1[0] - f0[0],
        f1[1] - f0[1],
        f1[2] - f0[2],
        f1[3] - f0[3],
        f1[4] - f0[4],
    ];
    let n = m.size();
    let mut all = vec![0f64; n * REPORT.len()];
    m.group().allgather(bytemuck::cast_slice(&mine), bytemuck::cast_slice_mut(&mut all))?;
    if m.rank() == 0 {
        let got = app.result(&mut m, size, at).map_err(dsm)?;
        compare(app, &got, &reference_file(dir, app, size, seed))?;
    }
    // Rank 0's check read pages the others may still serve.
    m.barrier().map_err(dsm)?;
    let rows: Vec<&[f64]> = all.chunks_exact(REPORT.len()).collect();
    let slowest = rows.iter().map(|r| r[0]).fold(0.0, f64::max);
    let mut r = blank(n, slowest, rows.iter().map(|row| row[1]).sum());
    // Each figure as the mean over the ranks (times) or the sum (counts).
    for (i, key) in REPORT.iter().enumerate().skip(1) {
        let sum: f64 = rows.iter().map(|row| row[i]).sum();
        let v = if key.ends_with("_s") { sum / n as f64 } else { sum };
        r.extra.insert((*key).into(), v);
    }
    let mean_secs = rows.iter().map(|row| row[0]).sum::<f64>() / n as f64;
    let waits: f64 = ["data_wait_s", "lock_s", "barrier_s", "protocol_s"].iter().map(|k| r.extra[*k]).sum();
    r.extra.insert("compute_s".into(), (mean_secs - waits).max(0.0));
    r.extra.insert("mean_secs".into(), mean_secs);
    m.leave().map_err(dsm)?;
    // One rank has no peer: its pages are all its own.
    Ok(r.checked(transport.as_deref().unwrap_or("local"), (app.words(size) * 8) as u64, size as u64))
}

/// Whether `got` is the one-process run's result in `file` (exactly, or to rounding for Water).
fn compare(app: App, got: &[u64], file: &Path) -> Result<(), EvalError> {
    let want =
        std::fs::read(file).map_err(|e| EvalError::Io(format!("the one-process result {}: {e}", file.display())))?;
    if want.len() != got.len() * 8 {
        return Err(EvalError::WrongOutput(format!(
            "{}: {} words against the one-process run's {}",
            app.name(),
            got.len(),
            want.len() / 8
        )));
    }
    for (i, (g, w)) in got.iter().zip(want.chunks_exact(8)).enumerate() {
        let w = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        let same = if app.exact() {
            *g == w
        } else {
            let (g, w) = (f64::from_bits(*g), f64::from_bits(w));
            (g - w).abs() <= WATER_TOLERANCE * w.abs().max(1.0)
        };
        if !same {
            return Err(EvalError::WrongOutput(format!(
                "{}: word {i} is {} where the one-process run has {}",
                app.name(),
                f64::from_bits(*g),
                f64::from_bits(w)
            )));
        }
    }
    Ok(())
}
