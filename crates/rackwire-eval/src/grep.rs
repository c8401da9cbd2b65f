//! The distributed grep (HP, on the grep data set of Pavlo et al.): every rank scans its
//! share of the records for a pattern, then the matching records are gathered at rank 0,
//! which writes them out. Four variants cross the cost of matching with the share of records
//! that match:
//!
//! - **LoC** (low compute): the plain substring `XYZ`, found with a vectorised substring
//!   search over the whole share.
//! - **HiC** (high compute): a regular expression, [`HIC_PATTERN`], matched record by record
//!   with its parts captured (the word around `XYZ`, as `grep -o` prints it) by an NFA
//!   simulation (a Pike VM), the way a matcher runs a pattern it can neither reduce to a
//!   substring search nor compile to a DFA (captures, back-references): every byte of every
//!   record against every live state. Here it costs about 50–60 times the substring search,
//!   so, as in HP's HiC runs, the network is not what limits the job.
//! - **LoN** / **HiN** (low / high network): 10% or 50% of the records match, so the reduce
//!   phase moves a tenth or a half of the data set.
//!
//! A record is [`RECORD_BYTES`] bytes: a 10-digit key (the record's number), then a 90-byte
//! value of lowercase words. The generator plants `XYZ` inside a word of the chosen records
//! and nowhere else (the value alphabet has no capitals), so which records match is known
//! without scanning: the gathered records are checked against exactly that set.

use std::path::{Path, PathBuf};

use memchr::memmem;
use rackwire_coll::Group;
use regex_automata::nfa::thompson::pikevm::PikeVM;

use crate::job::{Phases, RunResult};
use crate::net::DataPath;
use crate::records::{mix, record_crc, share, RECORDS_PER_RANK_MAX, RECORD_BYTES};
use crate::EvalError;

/// The substring every variant looks for.
pub const NEEDLE: &[u8] = b"XYZ";
/// The HiC variant's regular expression: a whole word with `XYZ` inside it, after at
/// least one word character; the parts before and after are captured.
pub const HIC_PATTERN: &str = r"(?-u)\b(\w+)XYZ(\w*)\b";

/// How costly the match is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compute {
    /// A plain substring.
    Low,
    /// A regular expression.
    High,
}

/// How many records match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Network {
    /// 10%.
    Low,
    /// 50%.
    High,
}

impl Network {
    /// The share of records that match.
    pub fn fraction(self) -> f64 {
        match self {
            Network::Low => 0.10,
            Network::High => 0.50,
        }
    }
}

/// One of the four variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Network share.
    pub net: Network,
    /// Matching cost.
    pub compute: Compute,
}

impl Variant {
    /// All four, in HP's order (Table 3).
    pub const ALL: [Variant; 4] = [
        Variant { net: Network::Low, compute: Compute::Low },
        Variant { net: Network::Low, compute: Compute::High },
        Variant { net: Network::High, compute: Compute::Low },
        Variant { net: Network::High, compute: Compute::High },
    ];

    /// HP's name for it: `LoN-LoC`, `LoN-HiC`, `HiN-LoC`, `HiN-HiC`.
    pub fn name(self) -> &'static str {
        match (self.net, self.compute) {
            (Network::Low, Compute::Low) => "LoN-LoC",
            (Network::Low, Compute::High) => "LoN-HiC",
            (Network::High, Compute::Low) => "HiN-LoC",
            (Network::High, Compute::High) => "HiN-HiC",
        }
    }

    /// The variant a name means (case-insensitive).
    pub fn parse(s: &str) -> Result<Variant, EvalError> {
        Variant::ALL.into_iter().find(|v| v.name().eq_ignore_ascii_case(s)).ok_or_else(|| {
            EvalError::BadArgument(format!("unknown grep variant {s:?} (LoN-LoC, LoN-HiC, HiN-LoC, HiN-HiC)"))
        })
    }
}

/// Whether record `n` of the data set `seed` holds the needle, for a match share `fraction`.
pub fn planted(seed: u64, n: u64, fraction: f64) -> bool {
    let draw = mix(seed ^ mix(n ^ 0x6a09_e667_f3bc_c909));
    (draw as f64) < fraction * u64::MAX as f64
}

/// Letters of the values: lowercase only, so the needle can only be where it was planted.
const LETTERS: &[u8; 26] = b"abcdefghijklmnopqrstuvwxyz";

/// Write record `n` into `out`.
pub fn write_record(seed: u64, n: u64, fraction: f64, out: &mut [u8]) {
    debug_assert_eq!(out.len(), RECORD_BYTES);
    let key = format!("{:010}", n % 10_000_000_000);
    out[..10].copy_from_slice(key.as_bytes());
    // Words of 3 to 10 letters separated by spaces.
    let mut state = mix(seed ^ n.rotate_left(17));
    let mut word_left = 0;
    for b in out[10..].iter_mut() {
        state = mix(state);
        if word_left == 0 {
            *b = b' ';
            word_left = 3 + (state % 8) as usize;
        } else {
            *b = LETTERS[(state >> 8) as usize % 26];
            word_left -= 1;
        }
    }
    if planted(seed, n, fraction) {
        // Inside a word: a letter on each side.
        let at = 12 + (mix(state) % 70) as usize;
        out[at - 1] = b'q';
        out[at..at + 3].copy_from_slice(NEEDLE);
        out[at + 3] = b'q';
    }
}

/// Records `first .. first + count` of the data set.
pub fn generate(seed: u64, fraction: f64, first: u64, count: u64) -> Vec<u8> {
    let mut out = vec![0u8; count as usize * RECORD_BYTES];
    for (i, rec) in out.chunks_exact_mut(RECORD_BYTES).enumerate() {
        write_record(seed, first + i as u64, fraction, rec);
    }
    out
}

/// A matcher for one variant.
pub enum Matcher {
    /// The substring search.
    Substring(Box<memmem::Finder<'static>>),
    /// The regular expression, run by a Pike VM.
    Regex(Box<PikeVM>),
}

impl Matcher {
    /// The matcher of `compute`.
    pub fn new(compute: Compute) -> Matcher {
        match compute {
            Compute::Low => Matcher::Substring(Box::new(memmem::Finder::new(NEEDLE))),
            Compute::High => Matcher::Regex(Box::new(PikeVM::new(HIC_PATTERN).expect("the HiC pattern is valid"))),
        }
    }

    /// The matching records of `data`, back to back, in order.
    pub fn scan(&self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Matcher::Substring(f) => {
                // One pass over the whole share; a hit names its record, and the scan goes
                // on at the next record (a record is taken once).
                let mut at = 0;
                while let Some(i) = f.find(&data[at..]) {
                    let rec = (at + i) / RECORD_BYTES * RECORD_BYTES;
                    out.extend_from_slice(&data[rec..rec + RECORD_BYTES]);
                    at = rec + RECORD_BYTES;
                    if at >= data.len() {
                        break;
                    }
                }
            }
            Matcher::Regex(vm) => {
                let mut cache = vm.create_cache();
                let mut caps = vm.create_captures();
                for rec in data.chunks_exact(RECORD_BYTES) {
                    vm.captures(&mut cache, &rec[10..], &mut caps);
                    if caps.is_match() {
                        out.extend_from_slice(rec);
                    }
                }
            }
        }
        out
    }
}

/// One grep run.
#[derive(Clone, Debug)]
pub struct GrepJob {
    /// Records in the data set.
    pub records: u64,
    /// The data set's seed.
    pub seed: u64,
    /// The variant.
    pub variant: Variant,
    /// Where the input and output files go.
    pub dir: PathBuf,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> EvalError {
    EvalError::Io(format!("{what} {}: {e}", path.display()))
}

/// Count and checksum of the records of `first .. first + count` that hold the needle, from
/// the generator alone.
fn expected(seed: u64, fraction: f64, first: u64, count: u64) -> (u64, u128) {
    let mut rec = [0u8; RECORD_BYTES];
    let (mut k, mut sum) = (0u64, 0u128);
    for n in first..first + count {
        if planted(seed, n, fraction) {
            write_record(seed, n, fraction, &mut rec);
            k += 1;
            sum = sum.wrapping_add(u128::from(record_crc(&rec)));
        }
    }
    (k, sum)
}

impl GrepJob {
    /// Run the grep at this rank over `path`; the result is checked at rank 0 against the
    /// records the generator planted the needle in.
    pub fn run(&self, g: &mut Group, path: &mut dyn DataPath) -> Result<RunResult, EvalError> {
        let (me, n) = (g.rank(), g.size());
        let fraction = self.variant.net.fraction();
        let (first, count) = share(self.records, n, me);
        if count > RECORDS_PER_RANK_MAX {
            return Err(EvalError::BadArgument(format!("{count} records per rank: at most {RECORDS_PER_RANK_MAX}")));
        }
        let inp = self.dir.join(format!("{}-grep-in-{me}", g.job()));
        std::fs::write(&inp, generate(self.seed, fraction, first, count)).map_err(|e| io_err("writing", &inp, e))?;
        let matcher = Matcher::new(self.variant.compute);
        let outp = self.dir.join(format!("{}-grep-out", g.job()));

        // The root's receive buffer registered ahead, with headroom over the expected share
        // of matches; a warm-up gather of that share on either path.
        let expect = (self.records as f64 * fraction) as u64 * RECORD_BYTES as u64;
        path.prepare(g, if me == 0 { expect + expect / 8 + 1024 * RECORD_BYTES as u64 } else { 0 })?;
        let mine = (count as f64 * fraction) as usize * RECORD_BYTES;
        let counts: Vec<usize> = (0..n).map(|r| if r == 0 { mine } else { 0 }).collect();
        crate::net::warm_up(path, g, &counts)?;

        let mut clock = Phases::start(g)?;
        let data = std::fs::read(&inp).map_err(|e| io_err("reading", &inp, e))?;
        let found = matcher.scan(&data);
        drop(data);
        clock.end(g, "scan")?;
        let gathered = path.gather(g, 0, &found)?;
        if let Some(got) = &gathered {
            use std::io::Write;
            let mut f = std::fs::File::create(&outp).map_err(|e| io_err("creating", &outp, e))?;
            got.for_each_chunk(RECORD_BYTES, |_, c| f.write_all(c).map_err(|e| io_err("writing", &outp, e)))?;
        }
        clock.end(g, "reduce")?;
        let result = clock.finish(g)?;
        let _ = std::fs::remove_file(&inp);

        // Not timed: rank 0 checks that it holds exactly the planted records, in rank order
        // (each rank's in record order), and tells the others.
        let mut verdict = [1u8];
        if let Some(got) = gathered {
            let _ = std::fs::remove_file(&outp);
            let got = got.to_vec()?;
            let (want_n, want_sum) = expected(self.seed, fraction, 0, self.records);
            let (got_n, got_sum) = crate::records::Summary::unordered_of(&got)?;
            let ordered = got.chunks_exact(RECORD_BYTES).map(|r| &r[..10]).is_sorted();
            if got_n != want_n || got_sum != want_sum || !ordered {
                verdict[0] = 0;
                tracing::error!(got_n, want_n, ordered, "grep gathered the wrong records");
            }
        }
        g.bcast(0, &mut verdict)?;
        if verdict[0] != 1 {
            return Err(EvalError::WrongOutput("grep: rank 0 did not gather exactly the matching records".into()));
        }
        Ok(result.checked(path.transport(), self.records * RECORD_BYTES as u64, self.records))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks both matchers against the generator: each finds exactly the planted records,
    // in order, for both match shares, and the share found is near the asked one.
    #[test]
    fn matchers_find_exactly_the_planted_records() {
        for v in Variant::ALL {
            let f = v.net.fraction();
            let data = generate(9, f, 100, 4000);
            let found = Matcher::new(v.compute).scan(&data);
            let want: Vec<u8> = data
                .chunks_exact(RECORD_BYTES)
                .enumerate()
                .filter(|(i, _)| planted(9, 100 + *i as u64, f))
                .flat_map(|(_, r)| r.iter().copied())
                .collect();
            assert_eq!(found, want, "{}", v.name());
            let share = (found.len() / RECORD_BYTES) as f64 / 4000.0;
            assert!((share - f).abs() < 0.03, "{}: share {share}", v.name());
            let (k, _) = expected(9, f, 100, 4000);
            assert_eq!(k as usize, found.len() / RECORD_BYTES);
        }
    }

    // Checks that names round-trip and a bad name is an error.
    #[test]
    fn variant_names() {
        for v in Variant::ALL {
            assert_eq!(Variant::parse(&v.name().to_lowercase()).unwrap(), v);
        }
        assert!(Variant::parse("MidN").is_err());
    }
}
