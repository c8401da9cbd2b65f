//! The page protocol of one rank, as a state machine: faults, fetched pages, releases and
//! acquires in; fetches, protection changes and diffs out.

use crate::diff::{self, DiffError};
use crate::PAGE_BYTES;

/// A rank of the job.
pub type Rank = u32;
/// A page of the shared range, by its index.
pub type PageId = u32;

/// The most ranks sharing one range.
pub const RANKS_MAX: usize = 256;
/// The most pages of one shared range (4 GiB of 4 KiB pages).
pub const PAGES_MAX: usize = 1 << 20;

/// What a rank may do with its copy of a page (the protection the caller sets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Nothing: the next touch faults.
    None,
    /// Read: a write faults.
    Read,
    /// Read and write.
    ReadWrite,
}

/// A page's state at one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// No valid copy here: the next touch fetches the home's.
    Invalid,
    /// Being fetched (a fault waits for it); `write` if the fault was a write.
    Fetching {
        /// The fault that asked was a write.
        write: bool,
    },
    /// A valid copy, read-only: a write keeps a twin first.
    Read,
    /// Written in this interval (with a twin, unless the page's home is this rank).
    Written,
}

/// What the caller does for the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Read the page from its home into this rank's copy, then call [`Protocol::fetched`].
    Fetch {
        /// The page.
        page: PageId,
        /// Its home.
        home: Rank,
    },
    /// Set the page's protection.
    Protect {
        /// The page.
        page: PageId,
        /// To this.
        access: Access,
    },
}

/// What a release (or an acquire that had to flush) hands the caller: the diffs to write to
/// the pages' homes, which must all have landed before the write notices are published, the
/// notices, and the protection changes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Released {
    /// `(page, home, encoded diff)` for each page written here and homed elsewhere.
    pub diffs: Vec<(PageId, Rank, Vec<u8>)>,
    /// Every page written in the interval.
    pub notices: Vec<PageId>,
    /// Protection changes.
    pub actions: Vec<Action>,
}

/// What went wrong in the shared memory: an event the protocol refused, or the system, the
/// fabric or the group under it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DsmError {
    /// A page past the shared range.
    #[error("page {page}: the range has {pages} pages")]
    NoSuchPage {
        /// The page.
        page: PageId,
        /// Pages in the range.
        pages: usize,
    },
    /// A rank past the job's.
    #[error("rank {rank}: the job has {ranks} ranks")]
    NoSuchRank {
        /// The rank.
        rank: Rank,
        /// Ranks in the job.
        ranks: usize,
    },
    /// The range or the job is past its limit.
    #[error("{what}: {n}, at most {max}")]
    Limit {
        /// What.
        what: &'static str,
        /// How many were asked for.
        n: usize,
        /// The most allowed.
        max: usize,
    },
    /// A word access at an address that is not a multiple of 8.
    #[error("a word at {at}: not 8-byte aligned")]
    Misaligned {
        /// The address.
        at: usize,
    },
    /// A page arrived that was not being fetched.
    #[error("page {0} arrived but was not being fetched")]
    NotFetching(PageId),
    /// No address range of the range's length was free in every rank's process.
    #[error("no address range of the range's length was free in every rank after {tries} tries")]
    NoCommonAddress {
        /// Addresses tried.
        tries: usize,
    },
    /// An access found the page still not held after the protocol was asked for it (a fetch
    /// that failed earlier and left the page on its way).
    #[error("page {0} is not held here after its fault was resolved")]
    NotHeld(PageId),
    /// A page's home asked to move while the page is being written or fetched (homes move
    /// only between intervals).
    #[error("page {0} cannot change home while it is written or fetched")]
    Busy(PageId),
    /// A diff for a page homed elsewhere.
    #[error("a diff for page {page}, whose home is rank {home}, not this one")]
    NotHome {
        /// The page.
        page: PageId,
        /// Its home.
        home: Rank,
    },
    /// A system call failed (mapping or protecting memory, a thread).
    #[error("{what}: system error {errno}")]
    System {
        /// What was being done.
        what: &'static str,
        /// The system's error number.
        errno: i32,
    },
    /// The fabric refused or lost an operation (a fetch, a diff).
    #[error("the fabric: {0}")]
    Fabric(#[from] rackwire::Error),
    /// The group under the range failed (a peer gone, a timeout).
    #[error("the group: {0}")]
    Group(#[from] rackwire_coll::CollError),
    /// A fetch returned something else than the page.
    #[error("fetching page {page} from rank {home} gave {got} bytes")]
    BadFetch {
        /// The page.
        page: PageId,
        /// Its home.
        home: Rank,
        /// What came back.
        got: usize,
    },
    /// A malformed diff.
    #[error("diff for page {page}: {why}")]
    BadDiff {
        /// The page.
        page: PageId,
        /// What was wrong.
        why: DiffError,
    },
}

/// Counters of one rank's protocol.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Faults taken (reads and writes).
    pub faults: u64,
    /// Pages fetched from their homes.
    pub fetches: u64,
    /// Twins kept.
    pub twins: u64,
    /// Diffs sent, and their bytes.
    pub diffs: u64,
    /// Bytes of those diffs.
    pub diff_bytes: u64,
    /// Diffs applied here, as a home.
    pub diffs_applied: u64,
    /// Copies invalidated by write notices.
    pub invalidations: u64,
    /// Pages whose home moved (first-touch placement), to this rank or away.
    pub homes_moved: u64,
    /// Pages written whole without a copy here (no fetch, no twin: their diff is the page).
    pub overwrites: u64,
}

/// One rank's page protocol over a shared range.
#[derive(Debug)]
pub struct Protocol {
    me: Rank,
    ranks: usize,
    homes: Vec<Rank>,
    state: Vec<PageState>,
    /// Twins of the pages written in this interval and homed elsewhere.
    twins: std::collections::HashMap<PageId, Vec<u8>>,
    /// Pages written whole in this interval with no copy before (see [`Protocol::overwrite`]):
    /// their diffs are the whole page.
    whole: std::collections::HashSet<PageId>,
    /// Pages written in this interval, in the order first written.
    written: Vec<PageId>,
    /// Pages written in this interval whose diffs an acquire already flushed: noticed at the
    /// next release.
    flushed: Vec<PageId>,
    /// Pages being fetched when an acquire invalidated them: what arrives may predate the
    /// diffs the acquire learned of, so they are fetched again.
    stale: std::collections::HashSet<PageId>,
    counters: Counters,
}

impl Protocol {
    /// Rank `me` of `ranks`, over a range whose page `p` has its home at `homes[p]`. A page
    /// homed here starts valid (the home keeps the master copy); every other starts invalid.
    pub fn new(me: Rank, ranks: usize, homes: Vec<Rank>) -> Result<Protocol, DsmError> {
        if ranks == 0 || ranks > RANKS_MAX {
            return Err(DsmError::Limit { what: "ranks", n: ranks, max: RANKS_MAX });
        }
        if homes.len() > PAGES_MAX {
            return Err(DsmError::Limit { what: "pages", n: homes.len(), max: PAGES_MAX });
        }
        for &rank in homes.iter().chain([&me]) {
            if rank as usize >= ranks {
                return Err(DsmError::NoSuchRank { rank, ranks });
            }
        }
        let state = homes.iter().map(|&h| if h == me { PageState::Read } else { PageState::Invalid }).collect();
        Ok(Protocol {
            me,
            ranks,
            homes,
            state,
            twins: Default::default(),
            whole: Default::default(),
            written: Vec::new(),
            flushed: Vec::new(),
            stale: Default::default(),
            counters: Counters::default(),
        })
    }

    /// Homes in turn: page `p` at rank `p % ranks`.
    pub fn round_robin(pages: usize, ranks: usize) -> Vec<Rank> {
        (0..pages).map(|p| (p % ranks.max(1)) as Rank).collect()
    }

    /// The page's state here.
    pub fn state(&self, page: PageId) -> Result<PageState, DsmError> {
        self.check(page).map(|i| self.state[i])
    }

    /// The page's home.
    pub fn home(&self, page: PageId) -> Result<Rank, DsmError> {
        self.check(page).map(|i| self.homes[i])
    }

    /// The counters so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    fn check(&self, page: PageId) -> Result<usize, DsmError> {
        let i = page as usize;
        if i < self.homes.len() {
            Ok(i)
        } else {
            Err(DsmError::NoSuchPage { page, pages: self.homes.len() })
        }
    }

    /// A touch of `page` faulted (`write`: a store). `copy` is this rank's copy as it is now
    /// (a page long; its bytes matter only when a twin is kept). The actions to carry out; on a
    /// page held already, the protection its state allows (the caller's view may be behind it).
    pub fn fault(&mut self, page: PageId, write: bool, copy: &[u8]) -> Result<Vec<Action>, DsmError> {
        let i = self.check(page)?;
        self.counters.faults += 1;
        match self.state[i] {
            PageState::Invalid => {
                self.state[i] = PageState::Fetching { write };
                self.counters.fetches += 1;
                Ok(vec![Action::Fetch { page, home: self.homes[i] }])
            }
            PageState::Fetching { write: w } => {
                // A second thread's touch while the page is on its way: it waits for the same
                // fetch; a write among them makes the arrival a write.
                self.state[i] = PageState::Fetching { write: w || write };
                Ok(Vec::new())
            }
            PageState::Read if write => Ok(self.start_writing(i, copy)),
            // Held already: the view asks to be opened as far as the state allows (a page
            // written through the service view is written without its view opened; a fault
            // another thread's fault resolved meanwhile opens nothing new).
            PageState::Written => Ok(vec![Action::Protect { page, access: Access::ReadWrite }]),
            PageState::Read => Ok(vec![Action::Protect { page, access: Access::Read }]),
        }
    }

    /// The first write to a valid page in this interval: a twin (unless the page is homed
    /// here), and the page writable.
    fn start_writing(&mut self, i: usize, copy: &[u8]) -> Vec<Action> {
        let page = i as PageId;
        if self.homes[i] != self.me {
            self.twins.insert(page, copy.to_vec());
            self.counters.twins += 1;
        }
        self.state[i] = PageState::Written;
        self.written.push(page);
        vec![Action::Protect { page, access: Access::ReadWrite }]
    }

    /// The caller is about to write every byte of `page` (before the next release) and has no
    /// valid copy: nothing is fetched and no twin kept; the page is writable at once, and its
    /// diff at the release is the whole page. On a page with a copy (or on its way) this is an
    /// ordinary write fault.
    pub fn overwrite(&mut self, page: PageId, copy: &[u8]) -> Result<Vec<Action>, DsmError> {
        let i = self.check(page)?;
        if self.state[i] != PageState::Invalid {
            return self.fault(page, true, copy);
        }
        self.counters.faults += 1;
        self.counters.overwrites += 1;
        self.whole.insert(page);
        self.state[i] = PageState::Written;
        self.written.push(page);
        Ok(vec![Action::Protect { page, access: Access::ReadWrite }])
    }

    /// The diff of a written page homed elsewhere against its twin (or whole), if it has one.
    fn take_diff(&mut self, page: PageId, copy: &[u8]) -> Option<Vec<u8>> {
        let d = if self.whole.remove(&page) {
            (copy.len() == PAGE_BYTES).then(|| diff::whole(copy))
        } else {
            // A copy that is not a page long cannot be diffed: the caller's bug, seen in the
            // diff it then sends (none).
            self.twins.remove(&page).and_then(|twin| diff::encode(&twin, copy).ok())
        }?;
        self.counters.diffs += 1;
        self.counters.diff_bytes += d.len() as u64;
        Some(d)
    }

    /// The page being fetched arrived; `copy` is this rank's copy, now the home's bytes.
    pub fn fetched(&mut self, page: PageId, copy: &[u8]) -> Result<Vec<Action>, DsmError> {
        let i = self.check(page)?;
        let PageState::Fetching { write } = self.state[i] else { return Err(DsmError::NotFetching(page)) };
        if self.stale.remove(&page) {
            self.counters.fetches += 1;
            return Ok(vec![Action::Fetch { page, home: self.homes[i] }]);
        }
        self.state[i] = PageState::Read;
        if write {
            return Ok(self.start_writing(i, copy));
        }
        Ok(vec![Action::Protect { page, access: Access::Read }])
    }

    /// A release: the diff of every page written in the interval and homed elsewhere (against
    /// its twin, `copy(page)` giving this rank's copy), the notices of every page written, and
    /// each written page read-only again (a later write starts the next interval's twin).
    pub fn release<'a>(&mut self, copy: impl Fn(PageId) -> &'a [u8]) -> Released {
        let mut out = Released { notices: std::mem::take(&mut self.flushed), ..Released::default() };
        for page in std::mem::take(&mut self.written) {
            let i = page as usize;
            if let Some(d) = self.take_diff(page, copy(page)) {
                out.diffs.push((page, self.homes[i], d));
            }
            self.state[i] = PageState::Read;
            out.notices.push(page);
            out.actions.push(Action::Protect { page, access: Access::Read });
        }
        // A page flushed by an acquire and written again since is noticed once.
        out.notices.sort_unstable();
        out.notices.dedup();
        out
    }

    /// An acquire: `notices` are the pages other ranks wrote in the intervals this rank now
    /// sees. Its copies of them go invalid (a copy homed here is the master, with their diffs
    /// applied: it stays). A page this rank wrote too in its current interval (false sharing:
    /// two writers of one page) is flushed first: its diff is in the returned
    /// [`Released::diffs`], to land at the home before the page is fetched again, and its
    /// notice goes out with the next release. A page being fetched is fetched again when it
    /// arrives (what arrives may predate the diffs).
    pub fn acquire<'a>(&mut self, notices: &[PageId], copy: impl Fn(PageId) -> &'a [u8]) -> Result<Released, DsmError> {
        for &page in notices {
            self.check(page)?;
        }
        let mut out = Released::default();
        for &page in notices {
            let i = page as usize;
            if self.homes[i] == self.me {
                continue;
            }
            match self.state[i] {
                PageState::Invalid | PageState::Read => {}
                PageState::Fetching { .. } => {
                    self.stale.insert(page);
                }
                PageState::Written => {
                    if let Some(d) = self.take_diff(page, copy(page)) {
                        out.diffs.push((page, self.homes[i], d));
                    }
                    self.written.retain(|&p| p != page);
                    if !self.flushed.contains(&page) {
                        self.flushed.push(page);
                    }
                }
            }
            if matches!(self.state[i], PageState::Read | PageState::Written) {
                self.state[i] = PageState::Invalid;
                self.counters.invalidations += 1;
                out.actions.push(Action::Protect { page, access: Access::None });
            }
        }
        Ok(out)
    }

    /// Move the page's home to `home` (first-touch placement, between intervals: after a
    /// barrier, when no page is written or being fetched). A page now homed here whose copy is
    /// not valid is fetched from its old home (the caller lets every rank's fetch finish before
    /// anyone touches the page again); a copy that is valid is the master already. A page
    /// homed here before keeps its copy, now a copy like any other.
    pub fn rehome(&mut self, page: PageId, home: Rank) -> Result<Vec<Action>, DsmError> {
        let i = self.check(page)?;
        if home as usize >= self.ranks {
            return Err(DsmError::NoSuchRank { rank: home, ranks: self.ranks });
        }
        let old = self.homes[i];
        if old == home {
            return Ok(Vec::new());
        }
        if matches!(self.state[i], PageState::Written | PageState::Fetching { .. }) {
            return Err(DsmError::Busy(page));
        }
        self.homes[i] = home;
        self.counters.homes_moved += 1;
        if home == self.me && self.state[i] == PageState::Invalid {
            self.state[i] = PageState::Fetching { write: false };
            self.counters.fetches += 1;
            return Ok(vec![Action::Fetch { page, home: old }]);
        }
        Ok(Vec::new())
    }

    /// As the page's home, apply a diff another rank sent to the master copy `master`. A diff
    /// for a page homed elsewhere, or a malformed one, is refused and nothing is written.
    pub fn apply_diff(&mut self, page: PageId, diff: &[u8], master: &mut [u8]) -> Result<(), DsmError> {
        let i = self.check(page)?;
        if self.homes[i] != self.me {
            return Err(DsmError::NotHome { page, home: self.homes[i] });
        }
        diff::apply(diff, master).map_err(|why| DsmError::BadDiff { page, why })?;
        self.counters.diffs_applied += 1;
        Ok(())
    }

    /// This rank.
    pub fn me(&self) -> Rank {
        self.me
    }

    /// Ranks in the job.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Pages in the range.
    pub fn pages(&self) -> usize {
        self.homes.len()
    }

    /// Bytes of the range.
    pub fn bytes(&self) -> usize {
        self.homes.len() * PAGE_BYTES
    }
}
