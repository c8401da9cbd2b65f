//! Link-flapping patterns for the swarm: links that drop and return many times, every link
//! between two nodes silent at once for a while, links that return in another order than they
//! left. Each pattern keeps every moment of total silence between two nodes shorter than
//! [`SILENCE_MAX_US`], well under a connection's peer timeout: the connection must carry on
//! through all of it, and everything in flight must complete.

use rackwire_proto::Time;

use crate::Rng;

/// The longest time every link between two nodes is down at once.
pub const SILENCE_MAX_US: Time = 3_000_000;
/// The most down-and-up cycles one pattern makes.
pub const CYCLES_MAX: u64 = 40;

/// Which links go down or up, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    /// When.
    pub at: Time,
    /// Between nodes `a` and `b`.
    pub a: usize,
    /// See `a`.
    pub b: usize,
    /// Which link.
    pub link: usize,
    /// Down (true) or back up.
    pub down: bool,
}

/// The pattern kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flap {
    /// One link drops and returns again and again, quickly.
    OneLink,
    /// Every link between two nodes goes silent together, a few times.
    AllSilent,
    /// Every link goes down one after another, and they return in a shuffled order.
    Reordered,
}

impl Flap {
    /// One of the kinds.
    pub fn draw(r: &mut Rng) -> Flap {
        [Flap::OneLink, Flap::AllSilent, Flap::Reordered][r.range(0, 3) as usize]
    }

    /// The changes of this pattern between nodes `a` and `b` with `links` links, starting
    /// within `[0, start_by)`.
    pub fn changes(self, r: &mut Rng, a: usize, b: usize, links: usize, start_by: Time) -> Vec<Change> {
        let mut out = Vec::new();
        let mut t = r.range(0, start_by.max(1));
        let mut put = |at: Time, link: usize, down: bool| out.push(Change { at, a, b, link, down });
        match self {
            Flap::OneLink => {
                let link = r.range(0, links as u64) as usize;
                for _ in 0..r.range(5, CYCLES_MAX + 1) {
                    let up = t + r.range(200, 50_000);
                    put(t, link, true);
                    put(up, link, false);
                    t = up + r.range(200, 50_000);
                }
            }
            Flap::AllSilent => {
                for _ in 0..r.range(1, 5) {
                    let up = t + r.range(1_000, SILENCE_MAX_US);
                    for l in 0..links {
                        put(t, l, true);
                        put(up, l, false);
                    }
                    t = up + r.range(1_000, 300_000);
                }
            }
            Flap::Reordered => {
                for _ in 0..r.range(1, 4) {
                    // Down one after another; all are down by `last_down`.
                    let mut last_down = t;
                    for l in 0..links {
                        put(last_down, l, true);
                        last_down += r.range(0, 20_000);
                    }
                    // Back in a shuffled order, the first within the silence bound.
                    let mut order: Vec<usize> = (0..links).collect();
                    for i in (1..order.len()).rev() {
                        order.swap(i, r.range(0, i as u64 + 1) as usize);
                    }
                    let mut back = last_down + r.range(1_000, SILENCE_MAX_US / 2);
                    for &l in &order {
                        put(back, l, false);
                        back += r.range(0, 100_000);
                    }
                    t = back + r.range(1_000, 200_000);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks every pattern, over many draws: each down is followed by its up on the same link,
    // changes of one link alternate down/up, and no moment of total silence (every link of
    // the pair down) lasts longer than SILENCE_MAX_US.
    #[test]
    fn patterns_keep_total_silence_bounded() {
        let mut r = Rng::new(7);
        for _ in 0..2000 {
            let links = r.range(1, 5) as usize;
            let kind = Flap::draw(&mut r);
            let mut ch = kind.changes(&mut r, 0, 1, links, 500_000);
            ch.sort_by_key(|c| (c.at, !c.down));
            let mut down = vec![false; links];
            let mut silent_since = None;
            for c in &ch {
                assert_ne!(down[c.link], c.down, "{kind:?}: link {} changed to what it was", c.link);
                down[c.link] = c.down;
                match (down.iter().all(|&d| d), silent_since) {
                    (true, None) => silent_since = Some(c.at),
                    (false, Some(s)) => {
                        assert!(c.at - s <= SILENCE_MAX_US, "{kind:?}: silent {} µs", c.at - s);
                        silent_since = None;
                    }
                    _ => {}
                }
            }
            assert!(down.iter().all(|&d| !d), "{kind:?}: every link returns");
        }
    }
}
