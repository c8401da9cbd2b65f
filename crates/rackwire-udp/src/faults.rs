//! Seeded fault injection on a link's send path: drop, duplicate, reorder, corrupt.

use std::str::FromStr;

/// Fault rates, each a probability per frame, and the seed they are drawn from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultSpec {
    /// Drop the frame.
    pub drop: f64,
    /// Send it twice.
    pub dup: f64,
    /// Hold it back and send it after the next one.
    pub reorder: f64,
    /// Flip one bit.
    pub corrupt: f64,
    /// Seed.
    pub seed: u64,
    /// A link that drops everything for a while: (link, start, duration), in milliseconds
    /// since the link was opened.
    pub down: Option<(usize, u64, u64)>,
}

impl FaultSpec {
    /// No faults.
    pub fn is_clean(&self) -> bool {
        self.drop == 0.0 && self.dup == 0.0 && self.reorder == 0.0 && self.corrupt == 0.0 && self.down.is_none()
    }
}

impl FromStr for FaultSpec {
    type Err = String;
    /// `drop=0.02,dup=0.01,reorder=0.01,corrupt=0.001,down=1@300+2000,seed=7` (any subset,
    /// any order; `down=L@S+D`: link L drops everything from S ms to S+D ms after it opened).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut f = FaultSpec::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("fault {part:?}: expected key=value"))?;
            if k == "seed" {
                f.seed = v.parse().map_err(|_| format!("fault seed {v:?} is not a number"))?;
                continue;
            }
            if k == "down" {
                let bad = || format!("fault down={v}: expected LINK@START_MS+DURATION_MS");
                let (link, rest) = v.split_once('@').ok_or_else(bad)?;
                let (start, dur) = rest.split_once('+').ok_or_else(bad)?;
                f.down = Some((
                    link.parse().map_err(|_| bad())?,
                    start.parse().map_err(|_| bad())?,
                    dur.parse().map_err(|_| bad())?,
                ));
                continue;
            }
            let p: f64 = v.parse().map_err(|_| format!("fault {k}={v}: not a number"))?;
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("fault {k}={v}: a probability is 0..=1"));
            }
            match k {
                "drop" => f.drop = p,
                "dup" => f.dup = p,
                "reorder" => f.reorder = p,
                "corrupt" => f.corrupt = p,
                _ => return Err(format!("unknown fault {k:?} (drop, dup, reorder, corrupt, seed)")),
            }
        }
        Ok(f)
    }
}

/// Applies a [`FaultSpec`] to frames on their way out.
#[derive(Debug)]
pub struct FaultInjector {
    spec: FaultSpec,
    link: usize,
    opened: std::time::Instant,
    state: u64,
    held: Option<Vec<u8>>,
    /// Frames dropped, duplicated, reordered, corrupted, and dropped while the link was down.
    pub counts: [u64; 5],
}

impl FaultInjector {
    /// An injector drawing from `spec.seed` (mixed with `link` so links differ).
    pub fn new(spec: FaultSpec, link: usize) -> Self {
        FaultInjector {
            spec,
            link,
            opened: std::time::Instant::now(),
            state: spec.seed ^ (link as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            held: None,
            counts: [0; 5],
        }
    }

    fn next(&mut self) -> f64 {
        // splitmix64
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// What to send in place of `frame`: none, one or more frames.
    pub fn apply(&mut self, frame: &[u8], out: &mut Vec<Vec<u8>>) {
        if let Some((link, start, dur)) = self.spec.down {
            let ms = self.opened.elapsed().as_millis() as u64;
            if link == self.link && (start..start + dur).contains(&ms) {
                self.counts[4] += 1;
                return;
            }
        }
        if self.next() < self.spec.drop {
            self.counts[0] += 1;
            return;
        }
        let mut f = frame.to_vec();
        if !f.is_empty() && self.next() < self.spec.corrupt {
            let bit = (self.next() * (f.len() * 8) as f64) as usize % (f.len() * 8);
            f[bit / 8] ^= 1 << (bit % 8);
            self.counts[3] += 1;
        }
        if self.next() < self.spec.dup {
            self.counts[1] += 1;
            out.push(f.clone());
        }
        if self.held.is_none() && self.next() < self.spec.reorder {
            self.counts[2] += 1;
            self.held = Some(f);
            return;
        }
        out.push(f);
        if let Some(h) = self.held.take() {
            out.push(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the spec parser: values, unknown keys and out-of-range rates.
    #[test]
    fn parses_specs() {
        let f: FaultSpec = "drop=0.02, dup=0.01,reorder=0.01,corrupt=0.001,seed=7,down=1@300+2000".parse().unwrap();
        assert_eq!(
            f,
            FaultSpec { drop: 0.02, dup: 0.01, reorder: 0.01, corrupt: 0.001, seed: 7, down: Some((1, 300, 2000)) }
        );
        assert!("down=1@300".parse::<FaultSpec>().is_err());
        assert!("drop=2".parse::<FaultSpec>().is_err());
        assert!("lose=0.1".parse::<FaultSpec>().is_err());
        assert!("drop".parse::<FaultSpec>().is_err());
        assert!("".parse::<FaultSpec>().unwrap().is_clean());
    }

    // Checks the rates come out about as asked over many frames, and that the same seed gives
    // the same faults.
    #[test]
    fn rates_are_about_right_and_seeded() {
        let spec = FaultSpec { drop: 0.1, dup: 0.05, seed: 3, ..FaultSpec::default() };
        let run = || {
            let mut f = FaultInjector::new(spec, 0);
            let mut out = Vec::new();
            for i in 0..10_000u32 {
                f.apply(&i.to_be_bytes(), &mut out);
            }
            (f.counts, out.len())
        };
        let (counts, n) = run();
        assert_eq!(counts[4], 0);
        assert!((800..1200).contains(&counts[0]), "{counts:?}");
        assert!((300..700).contains(&counts[1]), "{counts:?}");
        assert_eq!(n as u64, 10_000 - counts[0] + counts[1]);
        assert_eq!(run(), (counts, n));
    }
}
