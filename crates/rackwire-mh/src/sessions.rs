//! The management host's open sessions, and the bounds on those not admitted yet: at most
//! [`PRE_ADMISSION_MAX`] at once (a new one pushes the oldest out) and each given
//! [`ADMISSION_TIMEOUT`] in all to pass admission, however it trickles its bytes. Slow or idle
//! connections therefore cannot crowd out nodes that join.

use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

/// Connections not admitted yet, at most.
pub const PRE_ADMISSION_MAX: usize = 64;
/// The time a connection has, in all, to pass admission.
pub const ADMISSION_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest line read before admission (a hello or a proof is a few hundred bytes).
pub const ADMISSION_LINE_BYTES_MAX: usize = 4096;

struct Entry {
    stream: TcpStream,
    opened: Instant,
    admitted: bool,
}

/// Open sessions by id.
#[derive(Default)]
pub(crate) struct Sessions {
    map: HashMap<u64, Entry>,
}

impl Sessions {
    /// Track a new connection; when too many are waiting for admission, the one waiting
    /// longest is shut.
    pub fn open(&mut self, id: u64, stream: TcpStream) {
        let waiting = self.map.values().filter(|e| !e.admitted).count();
        if waiting >= PRE_ADMISSION_MAX {
            if let Some((&old, _)) = self.map.iter().filter(|(_, e)| !e.admitted).min_by_key(|(_, e)| e.opened) {
                if let Some(e) = self.map.remove(&old) {
                    let _ = e.stream.shutdown(Shutdown::Both);
                }
            }
        }
        self.map.insert(id, Entry { stream, opened: Instant::now(), admitted: false });
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
