//! The management host's open sessions, and the bounds on those not admitted yet: at most
//! [`PRE_ADMISSION_MAX`] at once (a new one pushes out the oldest of the address with the most
//! waiting), and each given [`ADMISSION_TIMEOUT`] in all to pass admission, however it
//! trickles its bytes. Slow or idle connections therefore
//! cannot crowd out nodes that join. Every admission that got as far as the host's proof is a
//! guess at the secret, unless the client then proves it: an address past
//! [`WRONG_SECRETS_PER_SOURCE_MAX`] such guesses a minute is turned away before any work.

use std::collections::HashMap;
use std::net::{IpAddr, Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// Connections not admitted yet, at most.
pub const PRE_ADMISSION_MAX: usize = 64;
/// The time a connection has, in all, to pass admission.
pub const ADMISSION_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest line read before admission (a hello or a proof is a few hundred bytes).
pub const ADMISSION_LINE_BYTES_MAX: usize = 4096;
/// Wrong secrets from one source address in a [`GUESS_WINDOW`], at most: past them, its
/// connections are closed before any work until the window ends (each is a guess at the
/// secret; this many a minute is hopeless against a secret of 16 random bytes anyway).
pub const WRONG_SECRETS_PER_SOURCE_MAX: u32 = 32;
/// See [`WRONG_SECRETS_PER_SOURCE_MAX`].
pub const GUESS_WINDOW: Duration = Duration::from_secs(60);
/// Source addresses whose wrong secrets are counted, at most (the oldest windows go first).
pub const GUESS_SOURCES_MAX: usize = 4096;

struct Entry {
    stream: TcpStream,
    opened: Instant,
    admitted: bool,
    from: Option<IpAddr>,
}

/// Open sessions by id, and the wrong secrets counted by source.
#[derive(Default)]
pub(crate) struct Sessions {
    map: HashMap<u64, Entry>,
    /// Per source address: when its window began, and the wrong secrets in it.
    guesses: HashMap<IpAddr, (Instant, u32)>,
}

/// Why a connection was closed before admission began.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turned {
    /// Its source gave [`WRONG_SECRETS_PER_SOURCE_MAX`] wrong secrets in this window.
    SourceGuessing,
}

impl Sessions {
    /// Whether a connection from `from` may begin admission (before any work is done for it).
    pub fn admissible(&mut self, from: IpAddr) -> Result<(), Turned> {
        if let Some(&(since, n)) = self.guesses.get(&from) {
            if since.elapsed() < GUESS_WINDOW && n >= WRONG_SECRETS_PER_SOURCE_MAX {
                return Err(Turned::SourceGuessing);
            }
        }
        Ok(())
    }

    /// A wrong secret came from `from`.
    pub fn wrong_secret(&mut self, from: IpAddr) {
        if !self.guesses.contains_key(&from) && self.guesses.len() >= GUESS_SOURCES_MAX {
            self.guesses.retain(|_, (since, _)| since.elapsed() < GUESS_WINDOW);
            if self.guesses.len() >= GUESS_SOURCES_MAX {
                if let Some(oldest) = self.guesses.iter().min_by_key(|(_, (since, _))| *since).map(|(a, _)| *a) {
                    self.guesses.remove(&oldest);
                }
            }
        }
        let e = self.guesses.entry(from).or_insert((Instant::now(), 0));
        if e.0.elapsed() >= GUESS_WINDOW {
            *e = (Instant::now(), 0);
        }
        e.1 = e.1.saturating_add(1);
    }

    /// Track a new connection from `from`; when too many are waiting for admission, the one
    /// waiting longest among those of the address with the most waiting is shut (a flood from
    /// one address pushes out its own connections, not other addresses' joins; a host whose
    /// many nodes join at once shares the slots with the rest as before).
    pub fn open(&mut self, id: u64, stream: TcpStream, from: Option<IpAddr>) {
        let waiting = self.map.values().filter(|e| !e.admitted).count();
        if waiting >= PRE_ADMISSION_MAX {
            let mut by_source: HashMap<Option<IpAddr>, usize> = HashMap::new();
            for e in self.map.values().filter(|e| !e.admitted) {
                *by_source.entry(e.from).or_default() += 1;
            }
            let busiest = by_source.into_iter().max_by_key(|(_, n)| *n).map(|(a, _)| a);
            self.shut_oldest_waiting(|e| Some(e.from) == busiest);
        }
        self.map.insert(id, Entry { stream, opened: Instant::now(), admitted: false, from });
    }

    /// Shut the connection waiting longest among those `which` picks.
    fn shut_oldest_waiting(&mut self, which: impl Fn(&Entry) -> bool) {
        let oldest = self.map.iter().filter(|(_, e)| !e.admitted && which(e)).min_by_key(|(_, e)| e.opened);
        if let Some(old) = oldest.map(|(&id, _)| id) {
            if let Some(e) = self.map.remove(&old) {
                let _ = e.stream.shutdown(Shutdown::Both);
            }
        }
    }

    /// Session `id` passed admission: no deadline from now on.
    pub fn admitted(&mut self, id: u64) {
        if let Some(e) = self.map.get_mut(&id) {
            e.admitted = true;
        }
    }

    /// Session `id` ended.
    pub fn close(&mut self, id: u64) {
        self.map.remove(&id);
    }

    /// Shut every connection that has not passed admission in [`ADMISSION_TIMEOUT`].
    pub fn reap_slow(&mut self) {
        let now = Instant::now();
        self.map.retain(|_, e| {
            let late = !e.admitted && now.duration_since(e.opened) >= ADMISSION_TIMEOUT;
            if late {
                let _ = e.stream.shutdown(Shutdown::Both);
            }
            !late
        });
    }

    /// Shut every session.
    pub fn shut_all(&self) {
        for e in self.map.values() {
            let _ = e.stream.shutdown(Shutdown::Both);
        }
    }

    /// Sessions open (admitted or not).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Sessions waiting for admission.
    pub fn waiting(&self) -> usize {
        self.map.values().filter(|e| !e.admitted).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks who makes room when PRE_ADMISSION_MAX connections wait: with one from address A
    // and the rest from address F (a flood), the next from F, and then one from a third
    // address, each shut one of F's (the oldest), never A's.
    #[test]
    fn a_flood_from_one_address_pushes_out_its_own() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let conn = || TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (a, f, c): (IpAddr, IpAddr, IpAddr) =
            ("198.18.0.1".parse().unwrap(), "198.18.0.2".parse().unwrap(), "198.18.0.3".parse().unwrap());
        let mut s = Sessions::default();
        s.open(0, conn(), Some(a));
        for id in 1..PRE_ADMISSION_MAX as u64 {
            s.open(id, conn(), Some(f));
        }
        s.open(1000, conn(), Some(f));
        s.open(1001, conn(), Some(c));
        assert_eq!(s.waiting(), PRE_ADMISSION_MAX);
        assert!(s.map.contains_key(&0), "the other address's join stays");
        assert!(!s.map.contains_key(&1) && !s.map.contains_key(&2), "the flood's oldest went");
        assert!(s.map.contains_key(&1000) && s.map.contains_key(&1001));
    }
}
