//! The provider's state in this process: one join of the fabric, shared by every domain; the
//! endpoints, completion queues, counters and address vectors, each behind a number the C
//! side holds; and progress (messages taken from the fabric and matched, pieces of sends
//! pushed out as the peers' rings have room), made by every call that reads or posts.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rackwire::{Conn, Fabric, FabricConfig, NodeId, Op, Receiver};
use rackwire_proto::{OwnIdMap, OwnIdSet};
use tracing::{debug, warn};

use crate::consts::*;
use crate::ep::{Matcher, RxDone};
use crate::queues::{Addr, Av, Cntr, Cq, Entry, ErrEntry, ProvErr, TxDone};
use crate::user::{capacity, copy_out, Iov};
use crate::wire::{Header, Kind, FRAGMENT_BYTES_MAX};

/// Bytes a buffer of many messages keeps at least unless the application sets another
/// (`FI_OPT_MIN_MULTI_RECV`): one whole fabric message.
pub const MIN_MULTI_RECV_DEFAULT: usize = FRAGMENT_BYTES_MAX;
/// Endpoints per process at most (the domain's `ep_cnt`).
pub const EPS_MAX: usize = 1024;
/// Operations an endpoint holds queued for sending at most (its `tx_attr.size`).
pub const TX_QUEUE_MAX: usize = 1024;
/// Nodes outside every address vector of this process whose messages are held, at most; the
/// messages of any more wait in the transport until the application inserts them.
pub const HELD_NODES_MAX: usize = 64;
/// Bytes held for one such node at most (past it, its further messages wait in the transport).
pub const HELD_BYTES_MAX: usize = 4 << 20;
/// Messages held for one such node at most (the same).
pub const HELD_MSGS_MAX: usize = 1024;
/// Answers to one node's RMA requests queued at most (its further messages wait in the
/// transport until it takes some: a node that asks and never reads cannot grow our memory).
pub const ANSWERS_QUEUED_MAX: usize = 1024;
/// How often automatic progress looks while the application sleeps on the doorbell itself.
const ARMED_LOOK: Duration = Duration::from_millis(1);
/// Messages taken from the fabric per round of progress at most.
const RX_BATCH: usize = 64;
/// How long a blocking read sleeps between looks at most.
pub(crate) const WAIT_SLICE: Duration = Duration::from_millis(1);

use crate::tx::TxOp;

/// Messages from a node outside every address vector, in arrival order.
#[derive(Debug, Default)]
struct Held {
    msgs: VecDeque<Vec<u8>>,
    bytes: usize,
}

impl Held {
    fn full(&self) -> bool {
        self.bytes >= HELD_BYTES_MAX || self.msgs.len() >= HELD_MSGS_MAX
    }
}

/// What became of a send tried at once ([`Provider::send_now`]).
pub(crate) enum Now {
    /// Handed over; the transport finishes it later if an operation is given.
    Sent(Option<Op>),
    /// It waits in the queue (the peer's ring has no room, or sends wait before it).
    Wait,
    /// It cannot go (the peer is unreachable or gone).
    Failed(i32),
}

impl Now {
    /// What became of a send to `node` the transport answered with `sent` (none: no room).
    fn of(node: NodeId, sent: Option<Op>) -> Now {
        let Some(mut o) = sent else { return Now::Wait };
        match o.poll() {
            Some(Err(e)) => {
                warn!(node, "rackwire provider: a send to node {node} failed: {e}");
                Now::Failed(FI_EHOSTUNREACH)
            }
            Some(Ok(_)) => Now::Sent(None),
            None => Now::Sent(Some(o)),
        }
    }
}

/// An endpoint.
#[derive(Debug, Default)]
pub(crate) struct Ep {
    pub enabled: bool,
    pub tx_cq: Option<(u64, bool)>,
    pub rx_cq: Option<(u64, bool)>,
    pub av: Option<u64>,
    pub tx_cntr: Option<u64>,
    pub rx_cntr: Option<u64>,
    /// Counters of RMA reads and of RMA writes (and atomics).
    pub rd_cntr: Option<u64>,
    pub wr_cntr: Option<u64>,
    pub rx: Matcher,
    pub txq: VecDeque<TxOp>,
    /// Bytes a buffer of many messages keeps at least, or is released (`FI_OPT_MIN_MULTI_RECV`).
    pub min_multi_recv: usize,
}

/// Everything behind the lock.
#[derive(Default)]
pub(crate) struct State {
    /// Tables keyed by numbers this process chose (looked up, never added to, by what a
    /// peer sends): the cheap hasher.
    pub(crate) eps: OwnIdMap<u32, Ep>,
    next_ep: u32,
    pub(crate) cqs: OwnIdMap<u64, Cq>,
    pub(crate) avs: OwnIdMap<u64, Av>,
    pub(crate) cntrs: OwnIdMap<u64, Cntr>,
    next_handle: u64,
    conns: OwnIdMap<NodeId, Conn>,
    pub(crate) next_msg: u64,
    /// Sends handed to a transport that completes them later (the edge transport).
    pub(crate) inflight: VecDeque<(Op, TxDone)>,
    domains: usize,
    pub(crate) dropped: u64,
    /// Registered regions by key.
    pub(crate) mrs: HashMap<u64, crate::regions::Mr>,
    /// RMA operations in flight by number.
    pub(crate) rma: HashMap<u64, crate::regions::RmaOp>,
    /// Sends queued over all endpoints.
    tx_queued: usize,
    /// Scratch list of the endpoints with sends queued (see [`Provider::progress_tx`]).
    waiting_eps: Vec<u32>,
    /// Completions raised so far: queue entries (in error or not) and finished receives.
    completions: u64,
    /// The last read of a queue returned completions (see `objects::cq_read`).
    pub(crate) just_read: bool,
    /// The standing view of the fabric's peers that progress takes messages through.
    receiver: Option<Receiver>,
    /// The nodes some address vector of this process names: messages are delivered from these
    /// only (an admitted node outside the application's peers reaches no receive).
    pub(crate) members: OwnIdSet<NodeId>,
    /// Messages from other nodes, held in arrival order until the application inserts them
    /// (it may insert a peer only after that peer sent: nothing is lost), within limits.
    held: OwnIdMap<NodeId, Held>,
    /// Answers to each node's RMA requests queued to go (see [`ANSWERS_QUEUED_MAX`]).
    pub(crate) answers: OwnIdMap<NodeId, usize>,
    /// Domains open with automatic progress, and the thread that makes it while any is.
    auto_domains: usize,
    auto: Option<crate::auto::AutoProgress>,
}

/// The provider in this process.
pub(crate) struct Provider {
    fabric: Fabric,
    pub(crate) me: NodeId,
    /// The [`FORKS`] count when it joined: a child forked since has the memory but none of
    /// the threads, so it joins afresh.
    generation: u64,
    /// The doorbell is armed for the application's own sleep on its descriptor (by
    /// `fi_trywait`): the next progress disarms it.
    armed: AtomicBool,
    st: Mutex<State>,
}

static PROVIDER: Mutex<Option<Arc<Provider>>> = Mutex::new(None);

/// Forks this process's line has gone through (counted in the child by the C side's
/// `pthread_atfork` handler, [`forked`]): one load tells a provider inherited through fork.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// This process is the child of a fork.
pub fn forked() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

fn ours(p: &Arc<Provider>) -> bool {
    p.generation == FORKS.load(Ordering::Relaxed)
}

/// Wait up to `d` for input from the fabric (a blocking call's nap between looks).
pub(crate) fn nap(d: Duration) -> Result<(), i32> {
    let p = lock(&PROVIDER).clone().filter(ours).ok_or(FI_EOPBADSTATE)?;
    let _ = p.fabric.wait_input(&[], d.min(WAIT_SLICE));
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether this process is configured to join a fabric (its environment or the host's
/// configuration file names one).
pub fn configured() -> bool {
    // A configuration that does not load is taken as meant: joining then says what is wrong.
    std::env::var_os(rackwire::vars::MH).is_some() || FabricConfig::from_env().map_or(true, |c| !c.mh.is_empty())
}

/// A warning for the user, where libfabric's own warnings go: standard error, when
/// `FI_LOG_LEVEL` asks for warnings or more (as libfabric's providers do); and to tracing.
fn log_warning(text: &str) {
    warn!("rackwire provider: {text}");
    let level = std::env::var("FI_LOG_LEVEL").unwrap_or_default().to_ascii_lowercase();
    if ["warn", "trace", "info", "debug"].contains(&level.as_str()) {
        eprintln!("libfabric:{}:rackwire:core: {text}", std::process::id());
    }
}

/// The provider, joining the fabric on first use.
fn provider() -> Result<Arc<Provider>, i32> {
    let mut p = lock(&PROVIDER);
    match p.take() {
        Some(old) if ours(&old) => {
            *p = Some(old.clone());
            return Ok(old);
        }
        // Inherited through fork: its threads are not in this process, so closing it would
        // wait on them. Let it be; this process joins as a node of its own.
        Some(old) => std::mem::forget(old),
        None => {}
    }
    if !configured() {
        return Err(FI_ENODATA);
    }
    let cfg = FabricConfig::from_env().map_err(|e| {
        log_warning(&format!("bad fabric configuration: {e}"));
        FI_EINVAL
    })?;
    let fabric = Fabric::join(cfg).map_err(|e| {
        log_warning(&format!("cannot join the fabric: {e}"));
        FI_ENODEV
    })?;
    let me = fabric.id();
    let generation = FORKS.load(Ordering::Relaxed);
    let made =
        Arc::new(Provider { fabric, me, generation, armed: AtomicBool::new(false), st: Mutex::new(State::default()) });
    *p = Some(made.clone());
    CHANGES.fetch_add(1, Ordering::Release);
    Ok(made)
}

/// Changes of [`PROVIDER`] (a join, a leave): a thread's cached provider is good while this
/// has not moved (with [`FORKS`]).
static CHANGES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's copy of the provider, and the [`CHANGES`] and [`FORKS`] counts it was
    /// taken at: every call but the first after a change reads it without the global lock
    /// or a reference count (each an atomic instruction on a shared cache line).
    static CACHED: std::cell::RefCell<Option<(u64, u64, Arc<Provider>)>> = const { std::cell::RefCell::new(None) };
}

/// Run `f` on the provider's state (after a round of progress).
pub(crate) fn with<T>(f: impl FnOnce(&Provider, &mut State) -> Result<T, i32>) -> Result<T, i32> {
    with_state(|p, st| {
        p.progress(st);
        f(p, st)
    })
}

/// Run `f` on the provider's state, with no progress first: for calls that make their own
/// (a send pushes what waits to go, a read of a queue looks for input when it needs more).
pub(crate) fn with_state<T>(f: impl FnOnce(&Provider, &mut State) -> Result<T, i32>) -> Result<T, i32> {
    CACHED.with(|cell| {
        let (changes, forks) = (CHANGES.load(Ordering::Acquire), FORKS.load(Ordering::Relaxed));
        {
            let mut cached = cell.borrow_mut();
            if !matches!(&*cached, Some((c, f, _)) if *c == changes && *f == forks) {
                *cached = lock(&PROVIDER).clone().filter(ours).map(|p| (changes, forks, p));
            }
        }
        // Borrowed, not cloned, for the call (no call made under it comes back here).
        let cached = cell.borrow();
        let p = cached.as_ref().map(|(_, _, p)| p).ok_or(FI_EOPBADSTATE)?;
        let mut st = lock(&p.st);
        f(p, &mut st)
    })
}

/// Forget this thread's cached provider (before it leaves the fabric).
fn uncache() {
    CACHED.with(|cell| cell.borrow_mut().take());
}

impl State {
    /// Whether any endpoint is bound to queue, vector or counter `h`.
    pub(crate) fn bound(&self, h: u64) -> bool {
        self.eps
            .values()
            .any(|e| [e.tx_cq.map(|c| c.0), e.rx_cq.map(|c| c.0), e.av, e.tx_cntr, e.rx_cntr].contains(&Some(h)))
    }

    /// Add endpoint `e`; its number (never [`ANY_EP`], never one in use).
    pub(crate) fn add_ep(&mut self, e: Ep) -> u32 {
        while self.eps.contains_key(&self.next_ep) || self.next_ep == ANY_EP {
            self.next_ep = self.next_ep.wrapping_add(1);
        }
        let id = self.next_ep;
        self.next_ep = self.next_ep.wrapping_add(1);
        self.eps.insert(id, e);
        id
    }

    /// Remove endpoint `ep` (its queued sends no longer count).
    pub(crate) fn remove_ep(&mut self, ep: u32) -> Option<Ep> {
        let e = self.eps.remove(&ep)?;
        self.tx_queued -= e.txq.len();
        for op in &e.txq {
            self.answer_gone(op);
        }
        Some(e)
    }

    /// `node` has as many answers queued as it may: its messages wait in the transport.
    pub(crate) fn answers_full(&self, node: NodeId) -> bool {
        self.answers.get(&node).is_some_and(|n| *n >= ANSWERS_QUEUED_MAX)
    }

    /// `op` left its queue: if it answered a node's request, that node may ask again.
    pub(crate) fn answer_gone(&mut self, op: &TxOp) {
        if !op.is_answer() {
            return;
        }
        let node = op.dest.0;
        if let Some(n) = self.answers.get_mut(&node) {
            *n -= 1;
            if *n == 0 {
                self.answers.remove(&node);
            }
        }
    }

    pub(crate) fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }

    pub(crate) fn ep(&mut self, ep: u32) -> Result<&mut Ep, i32> {
        self.eps.get_mut(&ep).ok_or(FI_EINVAL)
    }

    /// The `fi_addr_t` of `src` in endpoint `ep`'s vector.
    pub(crate) fn src_addr(&self, ep: u32, src: Addr) -> u64 {
        let av = self.eps.get(&ep).and_then(|e| e.av).and_then(|a| self.avs.get(&a));
        av.and_then(|av| av.lookup(src)).unwrap_or(FI_ADDR_UNSPEC)
    }

    pub(crate) fn count(&mut self, cntr: Option<u64>, ok: bool) {
        if let Some(c) = cntr.and_then(|c| self.cntrs.get_mut(&c)) {
            if ok {
                c.value += 1;
            } else {
                c.errors += 1;
            }
        }
    }

    /// For an operation from enabled endpoint `ep` to `fa` (an address of its vector) flagged
    /// `flags`: the peer, and whether a completion is written for it.
    pub(crate) fn prepare_tx(&self, ep: u32, fa: u64, flags: u64) -> Result<(Addr, bool), i32> {
        let e = self.eps.get(&ep).ok_or(FI_EINVAL)?;
        if !e.enabled {
            return Err(FI_EOPBADSTATE);
        }
        let to = e.av.and_then(|a| self.avs.get(&a)).ok_or(FI_EOPBADSTATE)?.resolve(fa).ok_or(FI_EINVAL)?;
        let selective = e.tx_cq.is_some_and(|(_, s)| s);
        Ok((to, flags & RW_NO_COMPLETION == 0 && (!selective || flags & FI_COMPLETION != 0)))
    }

    /// Queue `op` on endpoint `ep`'s sends.
    pub(crate) fn queue(&mut self, ep: u32, op: TxOp) {
        if let Some(e) = self.eps.get_mut(&ep) {
            e.txq.push_back(op);
            self.tx_queued += 1;
        }
    }

    pub(crate) fn tx_complete(&mut self, d: TxDone, err: Option<(i32, ProvErr)>) {
        let cntr = self.eps.get(&d.ep).and_then(|e| e.tx_cntr);
        self.count(cntr, err.is_none());
        self.tx_entry(d, err);
    }

    /// The completion of a send or an RMA operation, in its endpoint's transmit queue.
    pub(crate) fn tx_entry(&mut self, d: TxDone, err: Option<(i32, ProvErr)>) {
        let Some(ep) = self.eps.get(&d.ep) else { return };
        let Some(cq) = ep.tx_cq.and_then(|(c, _)| self.cqs.get_mut(&c)) else { return };
        let entry = Entry { ctx: d.ctx, flags: d.flags, len: d.len, src: FI_ADDR_UNSPEC, ..Entry::default() };
        match err {
            None if d.completion => cq.entries.push_back(entry),
            None => return,
            Some((err, prov)) => cq.errors.push_back(ErrEntry { entry, olen: 0, err, prov_errno: prov as i32 }),
        }
        self.completions += 1;
    }

    pub(crate) fn rx_complete(&mut self, ep: u32, d: RxDone) {
        let src = self.src_addr(ep, d.src);
        let Some(e) = self.eps.get(&ep) else { return };
        let (cq, cntr) = (e.rx_cq, e.rx_cntr);
        let truncated = d.copied < d.total;
        self.count(cntr, !truncated);
        self.completions += 1;
        let Some(cq) = cq.and_then(|(c, _)| self.cqs.get_mut(&c)) else { return };
        let class = if d.tagged { FI_TAGGED } else { FI_MSG };
        let entry = Entry {
            ctx: d.recv.ctx,
            flags: FI_RECV
                | class
                | if d.data.is_some() { FI_REMOTE_CQ_DATA } else { 0 }
                | if d.recv.release { FI_MULTI_RECV } else { 0 },
            len: d.copied,
            buf: d.recv.iov.first().map_or(0, |v| v.base),
            data: d.data.unwrap_or(0),
            tag: d.tag,
            src,
        };
        if truncated {
            let olen = d.total - d.copied;
            cq.errors.push_back(ErrEntry { entry, olen, err: FI_ETRUNC, prov_errno: ProvErr::Truncated as i32 });
        } else if d.recv.completion {
            cq.entries.push_back(entry);
        }
    }

    /// A message (or piece) from `from` for one of our endpoints (`member`: `from` is this
    /// node or one an address vector names; another's messages are held).
    fn dispatch(&mut self, from: NodeId, msg: &[u8], member: bool) {
        let (h, payload) = match Header::decode(msg) {
            Ok(x) => x,
            Err(e) => {
                self.dropped += 1;
                warn!(from, "rackwire provider: dropped a malformed message ({e:?})");
                return;
            }
        };
        match h.kind {
            // Refused at the target unless the initiator is in the endpoint's vector.
            Kind::Write | Kind::ReadReq | Kind::Atomic => return self.serve_rma(from, &h, payload),
            Kind::ReadResp | Kind::Ack => return self.rma_answer(from, &h, payload),
            Kind::Whole | Kind::First | Kind::Next => {}
        }
        if !member {
            let held = self.held.entry(from).or_default();
            held.bytes += msg.len();
            held.msgs.push_back(msg.to_vec());
            return;
        }
        let Some(ep) = self.eps.get_mut(&h.dst_ep) else {
            self.dropped += 1;
            debug!(from, ep = h.dst_ep, "rackwire provider: a message for an endpoint that is closed");
            return;
        };
        match ep.rx.arrive((from, h.src_ep), &h, payload) {
            Ok(Some(done)) => self.rx_complete(h.dst_ep, done),
            Ok(None) => {}
            Err(why) => {
                self.dropped += 1;
                warn!(from, "rackwire provider: dropped a message ({why:?})");
            }
        }
    }

    fn all_full(&self) -> bool {
        self.eps.values().any(|e| e.rx.full())
    }

    /// The address vectors changed: the nodes they name now, and the held messages of those
    /// nodes delivered, in the order they came.
    pub(crate) fn members_changed(&mut self) {
        self.members = self.avs.values().flat_map(Av::node_ids).collect();
        let now: Vec<NodeId> = self.held.keys().copied().filter(|n| self.members.contains(n)).collect();
        for n in now {
            if let Some(h) = self.held.remove(&n) {
                for m in h.msgs {
                    self.dispatch(n, &m, true);
                }
            }
        }
    }
}

impl crate::auto::Progress for Provider {
    fn round(&self) -> bool {
        self.progress_round()
    }

    fn wait_input(&self, d: Duration) {
        if self.armed.load(Ordering::Relaxed) {
            // The application sleeps on the doorbell (armed by `fi_trywait`): a wait here would
            // disarm it on waking. Peers ring it for the application; this thread looks again
            // soon instead, for what needs no application (RMA aimed at this process).
            std::thread::sleep(d.min(ARMED_LOOK));
            return;
        }
        let _ = self.fabric.wait_input(&[], d);
    }
}

impl Provider {
    /// Send what the edge transport holds back to share a frame with later operations: the
    /// application may not call again soon (a blocking MPI send returns, and its rank computes).
    pub(crate) fn flush(&self) {
        self.fabric.flush();
    }

    /// Make sure `st.conns` holds a live connection to `node` (looked up, not cloned, by the
    /// caller: a clone is two atomic instructions on a shared line per message).
    fn connected(&self, st: &mut State, node: NodeId) -> Result<(), i32> {
        // A connection that died (the peer left, or left and joined again under the same id)
        // is dropped here: the next one is made afresh.
        match st.conns.get(&node) {
            Some(c) if c.is_alive() => return Ok(()),
            Some(_) => {
                st.conns.remove(&node);
            }
            None => {}
        }
        let c = self.fabric.connect(node).map_err(|e| {
            warn!(node, "rackwire provider: cannot reach node {node}: {e}");
            FI_EHOSTUNREACH
        })?;
        st.conns.insert(node, c);
        Ok(())
    }

    /// Send a whole message (`h`, then the bytes of `iov`, at most [`FRAGMENT_BYTES_MAX`])
    /// to `node` now, if its ring has room: the path of a send with nothing queued before it,
    /// with no copy of the bytes but the one into the ring.
    pub(crate) fn send_now(&self, st: &mut State, node: NodeId, h: &Header, iov: &[Iov]) -> Now {
        if let Err(e) = self.connected(st, node) {
            return Now::Failed(e);
        }
        let conn = st.conns.get(&node).expect("connected above");
        let n = capacity(iov);
        let len = h.encoded_len() + n;
        let sent = conn.send_with(len, |buf| {
            let at = h.encode(buf);
            copy_out(iov, 0, &mut buf[at..len]);
            Some(len)
        });
        Now::of(node, sent)
    }

    /// A round of progress under the lock (automatic progress's); whether sends wait for
    /// room (so the next round should come soon).
    fn progress_round(&self) -> bool {
        let mut st = lock(&self.st);
        // Not the application's call: its doorbell, if it sleeps on it, stays armed.
        self.progress_rx(&mut st);
        self.progress_tx(&mut st);
        // An application asleep on the queues' descriptor hears of what this round completed.
        if self.armed.load(Ordering::Relaxed) && st.cqs.values().any(|q| !q.entries.is_empty() || !q.errors.is_empty())
        {
            self.fabric.wake_input();
        }
        st.tx_queued > 0 || !st.inflight.is_empty()
    }

    /// `fi_trywait` on queues `cqs`: whether the application may sleep on the fabric's
    /// descriptor now (nothing waits in them nor in the fabric; the doorbell is then armed).
    pub(crate) fn trywait(&self, st: &mut State, cqs: &[u64]) -> Result<(), i32> {
        for h in cqs {
            let q = st.cqs.get(h).ok_or(FI_EINVAL)?;
            if !q.entries.is_empty() || !q.errors.is_empty() {
                return Err(FI_EAGAIN);
            }
        }
        if self.fabric.arm_input() {
            return Err(FI_EAGAIN);
        }
        self.armed.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// The descriptor `fi_trywait`'s callers sleep on.
    pub(crate) fn wait_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.fabric.input_fd().as_raw_fd()
    }

    /// Take what the fabric holds for us, push out what waits for room, finish what the
    /// transports finished.
    pub(crate) fn progress(&self, st: &mut State) {
        // The application is back: a doorbell `fi_trywait` armed for it is disarmed.
        if self.armed.load(Ordering::Relaxed) && self.armed.swap(false, Ordering::Relaxed) {
            self.fabric.disarm_input();
        }
        self.progress_rx(st);
        self.progress_tx(st);
    }

    /// Take what the fabric holds for us (up to [`RX_BATCH`] messages a look, four looks),
    /// after driving the transports once from this thread (the edge transport's links are
    /// read here, with no hand-over from its network thread, while the application calls in:
    /// manual progress; shared memory needs no driving and costs nothing here).
    fn progress_rx(&self, st: &mut State) {
        self.fabric.progress();
        for _ in 0..4 {
            if st.all_full() {
                break;
            }
            let mut r = st.receiver.take().unwrap_or_else(|| self.fabric.receiver());
            // Taken: messages from the peers in some vector, and (held) from other nodes while
            // there is room to hold them; the rest wait in the transport.
            let members = std::mem::take(&mut st.members);
            let mut full: Vec<NodeId> = st.held.iter().filter(|(_, h)| h.full()).map(|(n, _)| *n).collect();
            // A node with as many answers queued as it may have waits too, member or not.
            full.extend(st.answers.keys().copied().filter(|n| st.answers_full(*n)));
            let held: Vec<NodeId> = st.held.keys().copied().collect();
            let room = st.held.len() < HELD_NODES_MAX;
            let me = self.me;
            let member = |n: NodeId| n == me || members.contains(&n);
            let accept = |n: NodeId| !full.contains(&n) && (member(n) || room || held.contains(&n));
            // Back to the application as soon as a message completed something: it usually
            // answers at once, and the answer carries the edge transport's acknowledgement.
            let before = st.completions;
            let taken = self.fabric.recv_waiting_from(&mut r, RX_BATCH, accept, |from, msg| {
                st.dispatch(from, msg, member(from));
                st.completions == before
            });
            st.members = members;
            st.receiver = Some(r);
            if st.completions != before {
                break;
            }
            match taken {
                Ok(n) if n < RX_BATCH => break,
                Ok(_) => {}
                Err(e) => {
                    debug!("rackwire provider: receiving: {e}");
                    break;
                }
            }
        }
    }

    /// Push out what waits for room, finish what the transports finished.
    pub(crate) fn progress_tx(&self, st: &mut State) {
        if st.tx_queued > 0 {
            // The endpoints with sends waiting, in a list kept from call to call (no allocation
            // per call while a large send waits for room).
            let mut eps = std::mem::take(&mut st.waiting_eps);
            eps.clear();
            eps.extend(st.eps.iter().filter(|(_, e)| !e.txq.is_empty()).map(|(id, _)| *id));
            for &ep in &eps {
                self.push(st, ep);
            }
            st.waiting_eps = eps;
        }
        for _ in 0..st.inflight.len() {
            let Some((mut op, done)) = st.inflight.pop_front() else { break };
            match op.poll() {
                None => st.inflight.push_back((op, done)),
                Some(Ok(_)) => st.tx_complete(done, None),
                Some(Err(e)) => {
                    warn!("rackwire provider: a send failed: {e}");
                    st.tx_complete(done, Some((FI_EIO, ProvErr::Fabric)));
                }
            }
        }
    }

    /// Push endpoint `ep`'s queued sends, piece by piece, while their peers have room.
    pub(crate) fn push(&self, st: &mut State, ep: u32) {
        loop {
            let Some(op) = st.eps.get_mut(&ep).and_then(|e| e.txq.front()) else { return };
            let (node, _) = op.dest;
            let (h, n) = op.next_piece();
            let len = h.encoded_len() + n;
            if node == self.me {
                let mut bytes = vec![0u8; len];
                op.fill(&h, n, &mut bytes);
                st.dispatch(node, &bytes, true);
                self.piece_sent(st, ep, n, None);
                continue;
            }
            if let Err(e) = self.connected(st, node) {
                self.fail_send(st, ep, e);
                continue;
            }
            let conn = st.conns.get(&node).expect("connected above");
            let op = st.eps.get(&ep).and_then(|e| e.txq.front()).expect("looked at above");
            let sent = conn.send_with(len, |buf| {
                op.fill(&h, n, buf);
                Some(len)
            });
            match Now::of(node, sent) {
                // No room at the peer: the rest goes at the next progress.
                Now::Wait => return,
                Now::Failed(e) => self.fail_send(st, ep, e),
                Now::Sent(pending) => self.piece_sent(st, ep, n, pending),
            }
        }
    }

    /// `n` more bytes of `ep`'s first queued send were handed over (`pending`: the
    /// transport finishes them later); the send completes with its last piece.
    fn piece_sent(&self, st: &mut State, ep: u32, n: usize, pending: Option<Op>) {
        let Some(e) = st.eps.get_mut(&ep) else { return };
        let Some(op) = e.txq.front_mut() else { return };
        op.sent += n;
        if op.sent < op.total {
            return;
        }
        let op = e.txq.pop_front().expect("looked at above");
        st.tx_queued -= 1;
        st.answer_gone(&op);
        match (pending, op.done) {
            (_, None) => {}
            (Some(o), Some(d)) => st.inflight.push_back((o, d)),
            (None, Some(d)) => st.tx_complete(d, None),
        }
    }

    /// `ep`'s first queued send could not go: it fails with `err`.
    fn fail_send(&self, st: &mut State, ep: u32, err: i32) {
        let Some(op) = st.eps.get_mut(&ep).and_then(|e| e.txq.pop_front()) else { return };
        st.tx_queued -= 1;
        st.answer_gone(&op);
        if let Some(d) = op.done {
            st.tx_complete(d, Some((err, ProvErr::PeerGone)));
        } else if let Some(id) = (op.header.kind != Kind::Ack).then_some(op.header.msg_id) {
            // An RMA request that could not go: its operation fails now.
            if let Some(r) = st.rma.remove(&id) {
                st.tx_entry(r.done, Some((err, ProvErr::PeerGone)));
            }
        }
    }
}

// ---- what the C side calls ----

/// The endpoint number of a source address that names no endpoint yet (`fi_getinfo`'s).
pub const ANY_EP: u32 = u32::MAX;

/// This process's node id, joining the fabric if it has not yet.
pub fn node_id() -> Result<u32, i32> {
    Ok(provider()?.me)
}

/// A domain opened (`auto`: with automatic progress, whose thread starts with the first such
/// domain): joins the fabric on the first.
pub fn domain_open(auto: bool) -> Result<(), i32> {
    let p = provider()?;
    let mut st = lock(&p.st);
    if auto && st.auto.is_none() {
        let started = crate::auto::AutoProgress::start(&p).map_err(|e| {
            log_warning(&format!("cannot start the automatic progress thread: {e}"));
            FI_ENOMEM
        })?;
        st.auto = Some(started);
    }
    st.domains += 1;
    st.auto_domains += usize::from(auto);
    Ok(())
}

/// A domain closed (`auto`: it had automatic progress; the thread stops with the last such
/// domain): the last one leaves the fabric.
pub fn domain_close(auto: bool) {
    let mut slot = lock(&PROVIDER);
    let (last, stopping) = slot.as_ref().filter(|p| ours(p)).map_or((false, None), |p| {
        let mut st = lock(&p.st);
        st.domains = st.domains.saturating_sub(1);
        if auto {
            st.auto_domains = st.auto_domains.saturating_sub(1);
        }
        let stopping = if st.auto_domains == 0 { st.auto.take() } else { None };
        (st.domains == 0, stopping)
    });
    // Outside the state's lock (the thread takes it for its rounds), before the provider is
    // let go (the thread holds it during a round).
    if let Some(t) = stopping {
        t.stop();
    }
    if last {
        uncache();
        CHANGES.fetch_add(1, Ordering::Release);
        if let Some(p) = slot.take() {
            match Arc::try_unwrap(p) {
                Ok(p) => p.fabric.close(),
                Err(p) => *slot = Some(p),
            }
        }
    }
}

/// Messages dropped as malformed or for closed endpoints (for tests and diagnostics).
pub fn dropped() -> u64 {
    with(|_, st| Ok(st.dropped)).unwrap_or(0)
}
