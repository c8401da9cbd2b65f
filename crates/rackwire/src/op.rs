//! Operation handles and flags.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::id::RegionId;
use crate::{Error, NodeId};

/// Options of one operation. The default is unordered and silent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpFlags {
    pub(crate) notify: Option<u64>,
    pub(crate) fence_before: bool,
    pub(crate) fence_after: bool,
}

impl OpFlags {
    /// Unordered, no notification.
    pub const NONE: OpFlags = OpFlags { notify: None, fence_before: false, fence_after: false };

    /// Tell the target when the operation's data is in place, with this 64-bit immediate.
    /// The target sees the notification only after the data (see [`crate::Fabric::wait_notification`]).
    pub fn notify(mut self, imm: u64) -> Self {
        self.notify = Some(imm);
        self
    }

    /// Backward fence: start only after every earlier operation on this connection completed.
    pub fn fence_before(mut self) -> Self {
        self.fence_before = true;
        self
    }

    /// Forward fence: later operations on this connection start only after this one completed.
    pub fn fence_after(mut self) -> Self {
        self.fence_after = true;
        self
    }

    /// The immediate, when a notification was asked for.
    pub fn notification(&self) -> Option<u64> {
        self.notify
    }
}

/// What a completed operation yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// A write, batch or message is in place.
    Done,
    /// The bytes a read returned.
    Data(Vec<u8>),
    /// The value an atomic found before it acted (a compare-and-swap succeeded iff this
    /// equals the expected value).
    Value(u64),
}

impl Completion {
    /// The value of an atomic, if this is one.
    pub fn value(&self) -> Option<u64> {
        match self {
            Completion::Value(v) => Some(*v),
            _ => None,
        }
    }
    /// The bytes of a read (empty for other operations).
    pub fn into_data(self) -> Vec<u8> {
        match self {
            Completion::Data(d) => d,
            _ => Vec::new(),
        }
    }
}

/// What a waiting thread drives itself (polls the network) instead of sleeping.
pub trait Drive: Send + Sync {
    /// Make progress: true when something was done.
    fn drive(&self) -> bool;
    /// The waiting thread stops driving and is about to sleep: whoever else makes progress
    /// must take over now, not when it next happens to look.
    fn rest(&self);
    /// Send now what operations left gathered for a later frame (a thread that will not drive
    /// the transport next, and does not wait for these operations, says so).
    fn flush(&self);
}

/// A shared [`Drive`] (cloning it allocates nothing).
pub(crate) type Driver = Arc<dyn Drive>;

/// Where an asynchronous transport puts an operation's outcome.
#[derive(Default)]
pub struct OpCell {
    slot: Mutex<Option<Result<Completion, Error>>>,
    cv: Condvar,
    /// Threads asleep on `cv` (changed under `slot`'s lock): completing wakes only when there
    /// are some, so a completion seen by a polling waiter costs no system call.
    sleepers: AtomicUsize,
    /// Drive progress while waiting, for this long, before sleeping.
    driver: Option<(Driver, Duration)>,
}

impl std::fmt::Debug for OpCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpCell").field("done", &self.slot.lock().map(|s| s.is_some()).unwrap_or(false)).finish()
    }
}

impl OpCell {
    /// A cell whose waiters call `driver` for up to `spin` before they sleep.
    pub fn with_driver(driver: Driver, spin: Duration) -> Self {
        OpCell {
            slot: Mutex::new(None),
            cv: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            driver: Some((driver, spin)),
        }
    }

    /// Record the outcome and wake waiters. Only the first outcome counts.
    pub fn complete(&self, r: Result<Completion, Error>) {
        let mut s = self.slot.lock().unwrap_or_else(|e| e.into_inner());
        if s.is_none() {
            *s = Some(r);
            if self.sleepers.load(Ordering::Relaxed) > 0 {
                self.cv.notify_all();
            }
        }
    }
}

/// What an operation ends with.
type Outcome = Result<Completion, Error>;

/// The outcome of two operations made one: the first one's error, else the second's outcome.
fn first_error_or(first: Option<Outcome>, second: Outcome) -> Outcome {
    match first {
        Some(Err(e)) => Err(e),
        _ => second,
    }
}

#[derive(Debug)]
enum State {
    Ready(Result<Completion, Error>),
    Pending(Arc<OpCell>),
    /// Two operations that make one (see [`Op::then`]); the first one's outcome once known.
    Pair(Box<(Op, Op, Option<Outcome>)>),
    Taken,
}

/// A handle to one operation.
///
/// `poll` never blocks; `wait` blocks until the outcome; `wait_timeout` blocks at most the
/// given time and returns [`Error::Timeout`] if the operation is still running (the handle
/// stays valid, so it can be waited on again). The outcome is handed out once.
#[derive(Debug)]
#[must_use = "an operation's outcome (and its errors) is only seen through its handle"]
pub struct Op {
    state: State,
}

impl Op {
    /// An operation that already completed.
    pub fn ready(r: Result<Completion, Error>) -> Op {
        Op { state: State::Ready(r) }
    }

    /// An operation completed later through `cell` (for asynchronous transports).
    pub fn pending(cell: Arc<OpCell>) -> Op {
        Op { state: State::Pending(cell) }
    }

    /// One operation made of `self` and `next` (issued already): it completes when both have,
    /// with the first error among them, else `next`'s outcome.
    pub fn then(self, next: Op) -> Op {
        match self.state {
            // A success known now adds nothing to wait for.
            State::Ready(Ok(_)) => next,
            state => Op { state: State::Pair(Box::new((Op { state }, next, None))) },
        }
    }

    /// The outcome if the operation has completed, else `None`. After the outcome was handed
    /// out once, `None` for ever.
    pub fn poll(&mut self) -> Option<Result<Completion, Error>> {
        if let State::Pair(pair) = &mut self.state {
            let (first, second, first_out) = &mut **pair;
            if first_out.is_none() {
                *first_out = Some(first.poll()?);
            }
            let second_out = second.poll()?;
            let out = first_error_or(first_out.take(), second_out);
            self.state = State::Taken;
            return Some(out);
        }
        match &self.state {
            State::Ready(_) => match std::mem::replace(&mut self.state, State::Taken) {
                State::Ready(r) => Some(r),
                _ => unreachable!("matched Ready above"),
            },
            State::Pending(cell) => {
                let r = cell.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
                if r.is_some() {
                    self.state = State::Taken;
                }
                r
            }
            State::Pair(_) => unreachable!("handled above"),
            State::Taken => None,
        }
    }

    /// True once the outcome was handed out.
    fn is_taken(&self) -> bool {
        matches!(self.state, State::Taken)
    }

    /// True once the outcome is known (and not yet taken).
    pub fn is_done(&self) -> bool {
        match &self.state {
            State::Ready(_) => true,
            State::Pending(cell) => cell.slot.lock().unwrap_or_else(|e| e.into_inner()).is_some(),
            State::Pair(pair) => (pair.2.is_some() || pair.0.is_done()) && pair.1.is_done(),
            State::Taken => false,
        }
    }

    /// Block until the operation completes.
    pub fn wait(mut self) -> Result<Completion, Error> {
        // An outcome already there (ready, or completed since) is taken without reading the
        // clock for a deadline.
        if let Some(r) = self.poll() {
            return r;
        }
        loop {
            match self.wait_timeout(Duration::from_secs(3600)) {
                Err(Error::Timeout) if !matches!(self.state, State::Taken) => continue,
                r => return r,
            }
        }
    }

    /// Block at most `d`. [`Error::Timeout`] means still running; the handle stays usable.
    pub fn wait_timeout(&mut self, d: Duration) -> Result<Completion, Error> {
        let deadline = Instant::now() + d;
        if let State::Pair(pair) = &mut self.state {
            let (first, second, first_out) = &mut **pair;
            if first_out.is_none() {
                let r = first.wait_timeout(d);
                if !first.is_taken() {
                    return r;
                }
                *first_out = Some(r);
            }
            let r = second.wait_timeout(deadline.saturating_duration_since(Instant::now()));
            if !second.is_taken() {
                return r;
            }
            let out = first_error_or(first_out.take(), r);
            self.state = State::Taken;
            return out;
        }
        if let State::Pending(cell) = &self.state {
            let cell = cell.clone();
            if let Some((drive, spin)) = &cell.driver {
                let spin_start = Instant::now();
                let spin_until = spin_start + (*spin).min(d);
                // The clock is read only every so often: it costs about as much as a look.
                let mut spins = 0u32;
                while cell.slot.lock().unwrap_or_else(|e| e.into_inner()).is_none() {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(crate::sync::CLOCK_EVERY_SPINS) {
                        let now = Instant::now();
                        if now >= spin_until {
                            drive.rest();
                            break;
                        }
                        if now >= spin_start + crate::sync::YIELD_AFTER {
                            std::thread::yield_now();
                        }
                    }
                    if !drive.drive() {
                        std::hint::spin_loop();
                    }
                }
            }
            let mut s = cell.slot.lock().unwrap_or_else(|e| e.into_inner());
            while s.is_none() {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::Timeout);
                }
                cell.sleepers.fetch_add(1, Ordering::Relaxed);
                s = cell.cv.wait_timeout(s, left).unwrap_or_else(|e| e.into_inner()).0;
                cell.sleepers.fetch_sub(1, Ordering::Relaxed);
            }
            drop(s);
        }
        self.poll().unwrap_or(Err(Error::Config("operation outcome was already taken".into())))
    }
}

/// How a scatter-gather batch is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    /// Merge entries whose source and destination both continue the previous entry.
    pub combine: bool,
    /// Copy channels to use at most (0: all the node has).
    pub channels: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions { combine: true, channels: 0 }
    }
}

/// The word a [`crate::Conn::write_signal`] updates in the target region once its data is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    /// Where the 64-bit word is (8-byte aligned).
    pub offset: u64,
    /// What is done to it.
    pub op: SignalOp,
}

/// How a waited-for word must compare with a value ([`crate::Region::wait_u64`]; OpenSHMEM's
/// `SHMEM_CMP_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cmp {
    /// Equal to the value.
    Eq,
    /// Not equal to it.
    Ne,
    /// Greater than it.
    Gt,
    /// Greater than or equal to it.
    Ge,
    /// Less than it.
    Lt,
    /// Less than or equal to it.
    Le,
}

impl Cmp {
    /// True when `word` compares with `value` this way.
    pub fn holds(self, word: u64, value: u64) -> bool {
        match self {
            Cmp::Eq => word == value,
            Cmp::Ne => word != value,
            Cmp::Gt => word > value,
            Cmp::Ge => word >= value,
            Cmp::Lt => word < value,
            Cmp::Le => word <= value,
        }
    }
}

/// How a signal word is updated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalOp {
    /// Store this value (needs write access; the cheapest update, for a word one sender owns).
    Set(u64),
    /// Add this value, atomically (needs atomic access; for a word several senders update).
    Add(u64),
}

impl Signal {
    /// Store `value` at `offset`.
    pub fn set(offset: u64, value: u64) -> Signal {
        Signal { offset, op: SignalOp::Set(value) }
    }

    /// Add `value` at `offset`.
    pub fn add(offset: u64, value: u64) -> Signal {
        Signal { offset, op: SignalOp::Add(value) }
    }
}

/// A peer's notification: an operation with [`crate::OpFlags::notify`] has placed its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The initiator.
    pub from: NodeId,
    /// The region of ours it touched.
    pub region: RegionId,
    /// Where.
    pub offset: u64,
    /// How many bytes.
    pub len: u64,
    /// The initiator's 64-bit immediate.
    pub imm: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver that counts how it is used and never makes progress.
    #[derive(Default)]
    struct Counting {
        drives: AtomicUsize,
        rests: AtomicUsize,
    }

    impl Drive for Counting {
        fn drive(&self) -> bool {
            self.drives.fetch_add(1, Ordering::Relaxed);
            false
        }
        fn rest(&self) {
            self.rests.fetch_add(1, Ordering::Relaxed);
        }
        fn flush(&self) {}
    }

    // Checks the waiter's side of driving: a waiter calls the driver while it spins and says
    // once that it stops (before it sleeps), and a waiter whose operation completes while it
    // spins never says so.
    #[test]
    fn waiter_drives_then_rests_once() {
        let d = Arc::new(Counting::default());
        let cell = Arc::new(OpCell::with_driver(d.clone(), Duration::from_millis(2)));
        let mut op = Op::pending(cell.clone());
        assert_eq!(op.wait_timeout(Duration::from_millis(30)), Err(Error::Timeout));
        assert!(d.drives.load(Ordering::Relaxed) > 0, "the waiter drove while it spun");
        assert_eq!(d.rests.load(Ordering::Relaxed), 1, "one rest before sleeping");

        let d = Arc::new(Counting::default());
        let cell = Arc::new(OpCell::with_driver(d.clone(), Duration::from_secs(60)));
        let op = Op::pending(cell.clone());
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            cell.complete(Ok(Completion::Done));
        });
        assert_eq!(op.wait(), Ok(Completion::Done));
        t.join().unwrap();
        assert_eq!(d.rests.load(Ordering::Relaxed), 0, "completed while spinning: no rest");
    }

    // Checks an operation made of two (`Op::then`): it is not done until both are; it yields
    // the first one's error even when the second succeeded; a wait that times out while the
    // second runs leaves it usable; and the outcome is handed out once.
    #[test]
    fn pair_completes_when_both_did_with_the_first_error() {
        let (a, b) = (Arc::new(OpCell::default()), Arc::new(OpCell::default()));
        let mut op = Op::pending(a.clone()).then(Op::pending(b.clone()));
        assert!(op.poll().is_none());
        a.complete(Err(Error::Timeout));
        assert!(!op.is_done(), "the second is still running");
        assert!(op.poll().is_none());
        b.complete(Ok(Completion::Value(3)));
        assert_eq!(op.poll(), Some(Err(Error::Timeout)), "the first one's error wins");
        assert!(op.poll().is_none(), "handed out once");

        let (a, b) = (Arc::new(OpCell::default()), Arc::new(OpCell::default()));
        let mut op = Op::pending(a.clone()).then(Op::pending(b.clone()));
        a.complete(Ok(Completion::Done));
        assert_eq!(op.wait_timeout(Duration::from_millis(5)), Err(Error::Timeout));
        let t = std::thread::spawn(move || b.complete(Ok(Completion::Value(9))));
        assert_eq!(op.wait_timeout(Duration::from_secs(10)), Ok(Completion::Value(9)));
        t.join().unwrap();

        let quick = Op::ready(Ok(Completion::Done)).then(Op::ready(Ok(Completion::Value(1))));
        assert_eq!(quick.wait(), Ok(Completion::Value(1)));
    }

    // Checks the handle's contract: a pending op times out without losing itself, completes
    // from another thread, hands out its outcome once, and then polls as None.
    #[test]
    fn pending_op_lifecycle() {
        let cell = Arc::new(OpCell::default());
        let mut op = Op::pending(cell.clone());
        assert!(op.poll().is_none());
        assert_eq!(op.wait_timeout(Duration::from_millis(5)), Err(Error::Timeout));
        let c2 = cell.clone();
        let t = std::thread::spawn(move || c2.complete(Ok(Completion::Value(7))));
        assert_eq!(op.wait_timeout(Duration::from_secs(10)), Ok(Completion::Value(7)));
        t.join().unwrap();
        assert!(op.poll().is_none());
        cell.complete(Ok(Completion::Done));
        let ready = Op::ready(Err(Error::Timeout));
        assert_eq!(ready.wait(), Err(Error::Timeout));
    }
}
