//! Every tuning constant of the edge driver, with the reason for its value. Times are in µs,
//! as the connections' ([`Time`]).

use crate::Time;

/// Frames taken from one link before the others get a turn.
pub const RECV_BURST: usize = 64;

/// How often the management host is asked whether a peer unreachable over every link is gone.
pub const PEER_CHECK_EVERY_US: Time = 500_000;

/// The retransmission timer's floor on real links. A user-space transport on a shared host
/// sees scheduling stalls of a few milliseconds; frames lost between delivered ones are found
/// sooner (by the overtaking rule and the receiver's reports), so the timer, which catches
/// tails and dead links, can wait out such a stall instead of declaring a window's worth of
/// frames lost.
pub const RTO_MIN_US: Time = 5_000;

/// An application thread that polled this recently is taken to be polling still, unless it
/// said it stopped ([`HandOff::rest`](super::HandOff::rest)). Long enough that a polling thread
/// the scheduler sets aside for a moment (common on a small, shared host) is not taken to have
/// left: the network thread would then take the frames it waits for and compete with it for
/// the core.
pub const PUMP_RECENT_US: Time = 500;

/// A receiving look of an application thread reads the links only while the transport is in
/// use: frames came in, or an operation was submitted, within this long. Past it, looks leave
/// the links to the network thread, which sleeps in the kernel until a frame comes. Without
/// it, a thread that waits for messages over shared memory on a node that also has edge peers
/// spends its spin in system calls on empty sockets (one per link per look, ~1 µs each): the
/// virtual NIC's receiving threads took most of a core that way in a rack with a host in
/// another memory domain. Longer than any round trip the transport waits for.
pub const QUIET_AFTER_US: Time = 1_000;

/// While an application thread polls, the network thread leaves it the links and the core
/// and only looks, every so often, whether it still polls: first after this long, then after
/// twice as long each time it found the thread still at it, up to [`PUMP_WATCH_MAX_US`].
/// Every look takes a core from a polling thread (on a small host, from the one about to
/// answer), so a thread that polls for long is looked at rarely. A thread that stops polling
/// to sleep says so and the network thread takes over at once.
pub const PUMP_WATCH_US: Time = 200;

/// The longest look interval of [`PUMP_WATCH_US`]: how late, at worst, the network thread
/// takes over from an application thread that stopped polling without saying so (it went on
/// with other work): frames for this node's memory, held answers and timers wait at most this
/// long past [`PUMP_RECENT_US`].
pub const PUMP_WATCH_MAX_US: Time = 2_000;

/// How long answers are held for a frame to ride in after an application thread was handed a
/// notification or message: it usually sends its reply at once, and one frame then carries
/// both. A later round sends them sooner; if the thread stops polling without sleeping, the
/// network thread's next look (within [`PUMP_WATCH_MAX_US`]).
pub const ANSWER_HOLD_US: Time = 200;

/// Longest the network thread sleeps without looking at its timers.
pub const IDLE_WAIT_MAX_US: Time = 10_000;

/// A link's gathered frames go out once they hold this many bytes: a run of large frames
/// starts moving (and the peer starts receiving) while the rest are still being prepared.
pub const TX_FLUSH_BYTES: usize = 64 * 1024;

/// The network thread's spin after work when answers come late or not at all: a thread that
/// sleeps pays for a wake-up when the next frame comes (on a virtual machine an interrupt
/// between cores), one that keeps looking pays for the core it holds.
pub const NET_SPIN_US: Time = 50;

/// The longest spin: answers slower than this are waited for asleep.
pub const NET_SPIN_MAX_US: Time = 200;

/// The spin is this many quarters of the answers' recent time (a margin for their spread).
pub const NET_SPIN_MARGIN_QUARTERS: Time = 5;
