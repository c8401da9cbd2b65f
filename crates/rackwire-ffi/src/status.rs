//! Status codes, the calling thread's last error, and the guard every entry point runs in.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use rackwire::Error;
use rackwire_coll::CollError;

/// What a call came to. One code per kind of error of the Rust API.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RwStatus {
    /// Success.
    Ok = 0,
    /// The owner has not granted this node the access the operation needs.
    Ungranted = 1,
    /// The owner revoked this node's grant.
    Revoked = 2,
    /// The range lies (partly) outside the region.
    OutOfBounds = 3,
    /// An atomic at an offset that is not 8-byte aligned.
    Misaligned = 4,
    /// The handle's key does not match the region's: forged or stale.
    BadKey = 5,
    /// The owner has no such region.
    UnknownRegion = 6,
    /// No such node, or the handle names another node than the connection's.
    UnknownPeer = 7,
    /// The peer went away.
    PeerGone = 8,
    /// No transport reaches the peer.
    Unreachable = 9,
    /// The operation did not complete in time.
    Timeout = 10,
    /// A message above the limit.
    MessageTooLarge = 11,
    /// A limit was reached (regions, peers, batch entries, ranks).
    Limit = 12,
    /// A region handle could not be parsed.
    BadHandle = 13,
    /// The peer failed authentication or broke the protocol.
    Protocol = 14,
    /// Bad configuration.
    Config = 15,
    /// The management host refused or could not be reached.
    ManagementHost = 16,
    /// A system resource failed.
    System = 17,
    /// The fabric was closed.
    Closed = 18,
    /// The region is moving to fresh memory: try again shortly.
    Busy = 19,
    /// A rank of the group is gone.
    RankGone = 20,
    /// A bad argument: a null pointer, a buffer too small, sizes that do not fit together.
    BadArgument = 21,
    /// The operation is not finished (from rw_op_value and rw_op_data before completion).
    NotReady = 22,
    /// An internal fault (a bug in rackwire); the message says where.
    Internal = 23,
}

impl RwStatus {
    /// Every status, to tell a valid code from C from an invalid one.
    pub(crate) const ALL: [RwStatus; 24] = [
        RwStatus::Ok,
        RwStatus::Ungranted,
        RwStatus::Revoked,
        RwStatus::OutOfBounds,
        RwStatus::Misaligned,
        RwStatus::BadKey,
        RwStatus::UnknownRegion,
        RwStatus::UnknownPeer,
        RwStatus::PeerGone,
        RwStatus::Unreachable,
        RwStatus::Timeout,
        RwStatus::MessageTooLarge,
        RwStatus::Limit,
        RwStatus::BadHandle,
        RwStatus::Protocol,
        RwStatus::Config,
        RwStatus::ManagementHost,
        RwStatus::System,
        RwStatus::Closed,
        RwStatus::Busy,
        RwStatus::RankGone,
        RwStatus::BadArgument,
        RwStatus::NotReady,
        RwStatus::Internal,
    ];
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// What went wrong inside a call.
pub(crate) enum Fail {
    Rw(Error),
    Coll(CollError),
    Arg(String),
    NotReady,
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Rw(e)
    }
}

impl From<CollError> for Fail {
    fn from(e: CollError) -> Fail {
        match e {
            CollError::Fabric(e) => Fail::Rw(e),
            e => Fail::Coll(e),
        }
    }
}

fn status_of(e: &Error) -> RwStatus {
    match e {
        Error::Ungranted { .. } => RwStatus::Ungranted,
        Error::Revoked { .. } => RwStatus::Revoked,
        Error::OutOfBounds { .. } => RwStatus::OutOfBounds,
        Error::Misaligned { .. } => RwStatus::Misaligned,
        Error::BadKey { .. } => RwStatus::BadKey,
        Error::UnknownRegion { .. } => RwStatus::UnknownRegion,
        Error::UnknownPeer(_) => RwStatus::UnknownPeer,
        Error::PeerGone(_) => RwStatus::PeerGone,
        Error::Unreachable { .. } => RwStatus::Unreachable,
        Error::Timeout => RwStatus::Timeout,
        Error::MessageTooLarge { .. } => RwStatus::MessageTooLarge,
        Error::Limit(_) => RwStatus::Limit,
        Error::BadHandle(_) => RwStatus::BadHandle,
        Error::Protocol(_) => RwStatus::Protocol,
        Error::Config(_) => RwStatus::Config,
        Error::Mh(_) => RwStatus::ManagementHost,
        Error::Sys { .. } => RwStatus::System,
        Error::Closed => RwStatus::Closed,
        Error::Busy { .. } => RwStatus::Busy,
    }
}

impl Fail {
    fn status(&self) -> RwStatus {
        match self {
            Fail::Rw(e) => status_of(e),
            Fail::Coll(CollError::RankGone { .. }) => RwStatus::RankGone,
            Fail::Coll(CollError::Timeout { .. }) => RwStatus::Timeout,
            Fail::Coll(CollError::Limit(_)) => RwStatus::Limit,
            Fail::Coll(CollError::Config(_)) => RwStatus::Config,
            Fail::Coll(_) | Fail::Arg(_) => RwStatus::BadArgument,
            Fail::NotReady => RwStatus::NotReady,
        }
    }

    fn message(&self) -> String {
        match self {
            Fail::Rw(e) => e.to_string(),
            Fail::Coll(e) => e.to_string(),
            Fail::Arg(m) => m.clone(),
            Fail::NotReady => "the operation is not finished".into(),
        }
    }
}

pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Run `f`, turning its error or panic into a status (and this thread's last error).
#[inline]
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Fail>) -> RwStatus {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => RwStatus::Ok,
        Ok(Err(e)) => failed(e),
        Err(p) => panicked(p),
    }
}

/// An error's status, its message kept as this thread's last error.
#[cold]
#[inline(never)]
fn failed(e: Fail) -> RwStatus {
    set_last_error(&e.message());
    e.status()
}

/// A panic caught at the boundary: an internal error.
#[cold]
#[inline(never)]
fn panicked(p: Box<dyn std::any::Any + Send>) -> RwStatus {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    set_last_error(&format!("internal error in rackwire: {what}"));
    RwStatus::Internal
}

pub(crate) fn arg(what: &str) -> Fail {
    Fail::Arg(format!("{what} is null"))
}

/// This thread's message for the last error (empty if none). Valid until this thread's next
/// call into rackwire.
#[no_mangle]
pub extern "C" fn rackwire_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// How a caller handles a status (`rackwire::ErrorKind`, plus success and the C API's own).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RwErrorKind {
    /// Success.
    None = 0,
    /// The target's rules refused the operation; nothing of the target was touched.
    Refused = 1,
    /// The peer is gone, unreachable, broke the protocol or did not answer in time.
    Lost = 2,
    /// The call itself was wrong (configuration, argument, a handle that does not parse).
    BadUse = 3,
    /// A limit was reached: of this build, or of a queue for now.
    Limit = 4,
    /// The management host refused or cannot be reached.
    ManagementHost = 5,
    /// A system resource failed.
    System = 6,
    /// Try again shortly (a region moving to fresh memory, an operation not finished yet).
    TryAgain = 7,
    /// The fabric was closed.
    Closed = 8,
    /// A fault inside rackwire, or a code that is no status.
    Internal = 9,
}

/// How a caller handles status `code`: the groups of the Rust API's `ErrorKind`, so a
/// program can act on a kind rather than on each code. Any integer is taken; one that is no
/// status is `RW_ERROR_KIND_INTERNAL`.
#[no_mangle]
pub extern "C" fn rw_status_kind(code: c_int) -> RwErrorKind {
    let Some(s) = RwStatus::ALL.iter().copied().find(|s| *s as c_int == code) else {
        return RwErrorKind::Internal;
    };
    match s {
        RwStatus::Ok => RwErrorKind::None,
        RwStatus::Ungranted
        | RwStatus::Revoked
        | RwStatus::OutOfBounds
        | RwStatus::Misaligned
        | RwStatus::BadKey
        | RwStatus::UnknownRegion => RwErrorKind::Refused,
        RwStatus::PeerGone | RwStatus::Unreachable | RwStatus::Timeout | RwStatus::Protocol | RwStatus::RankGone => {
            RwErrorKind::Lost
        }
        RwStatus::UnknownPeer
        | RwStatus::MessageTooLarge
        | RwStatus::BadHandle
        | RwStatus::Config
        | RwStatus::BadArgument => RwErrorKind::BadUse,
        RwStatus::Limit => RwErrorKind::Limit,
        RwStatus::ManagementHost => RwErrorKind::ManagementHost,
        RwStatus::System => RwErrorKind::System,
        RwStatus::Busy | RwStatus::NotReady => RwErrorKind::TryAgain,
        RwStatus::Closed => RwErrorKind::Closed,
        RwStatus::Internal => RwErrorKind::Internal,
    }
}

/// The name of a status, for messages: any integer is taken (a C enum may hold any), and
/// one that is no status is named "unknown status".
#[no_mangle]
pub extern "C" fn rw_status_name(code: c_int) -> *const c_char {
    let Some(s) = RwStatus::ALL.iter().copied().find(|s| *s as c_int == code) else {
        return c"unknown status".as_ptr();
    };
    let name: &'static CStr = match s {
        RwStatus::Ok => c"ok",
        RwStatus::Ungranted => c"ungranted",
        RwStatus::Revoked => c"revoked",
        RwStatus::OutOfBounds => c"out of bounds",
        RwStatus::Misaligned => c"misaligned",
        RwStatus::BadKey => c"bad key",
        RwStatus::UnknownRegion => c"unknown region",
        RwStatus::UnknownPeer => c"unknown peer",
        RwStatus::PeerGone => c"peer gone",
        RwStatus::Unreachable => c"unreachable",
        RwStatus::Timeout => c"timeout",
        RwStatus::MessageTooLarge => c"message too large",
        RwStatus::Limit => c"limit",
        RwStatus::BadHandle => c"bad handle",
        RwStatus::Protocol => c"protocol",
        RwStatus::Config => c"configuration",
        RwStatus::ManagementHost => c"management host",
        RwStatus::System => c"system",
        RwStatus::Closed => c"closed",
        RwStatus::Busy => c"busy",
        RwStatus::RankGone => c"rank gone",
        RwStatus::BadArgument => c"bad argument",
        RwStatus::NotReady => c"not ready",
        RwStatus::Internal => c"internal",
    };
    name.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a status code from C that is no status gets a name, not undefined behaviour
    // (issue: the function took the Rust enum by value, and an out-of-range integer in a Rust
    // enum is undefined): every status's own code gets its own name, codes past them, below
    // them and in between are "unknown status".
    #[test]
    fn any_integer_gets_a_status_name() {
        // SAFETY: rw_status_name returns a pointer to a static NUL-terminated string.
        let name = |c: c_int| unsafe { CStr::from_ptr(rw_status_name(c)) }.to_str().unwrap().to_string();
        let names: std::collections::HashSet<String> = RwStatus::ALL.iter().map(|s| name(*s as c_int)).collect();
        assert_eq!(names.len(), RwStatus::ALL.len(), "each status has a name of its own");
        assert!(!names.contains("unknown status"));
        assert_eq!(name(RwStatus::BadArgument as c_int), "bad argument");
        for code in [-1, 999, c_int::MAX, c_int::MIN] {
            assert_eq!(name(code), "unknown status", "{code}");
        }
    }

    // Checks that C gets the Rust API's grouping: each status that an `Error` maps to has the
    // kind of that error (`Error::kind`, compared through `status_of` on one error of each
    // variant), the C API's own codes their kinds by hand, and a code that is no status is
    // `Internal`.
    #[test]
    fn status_kinds_follow_the_rust_kinds() {
        use rackwire::{Access, ErrorKind, MhErrorText};
        let errors = [
            Error::Ungranted { region: 1, needed: Access::READ },
            Error::Revoked { region: 1 },
            Error::OutOfBounds { region: 1, offset: 0, len: 1, region_len: 0 },
            Error::Misaligned { offset: 3 },
            Error::BadKey { region: 1 },
            Error::UnknownRegion { node: 1, region: 1 },
            Error::UnknownPeer(1),
            Error::PeerGone(1),
            Error::Unreachable { node: 1, why: "no links".into() },
            Error::Timeout,
            Error::MessageTooLarge { len: 2, max: 1 },
            Error::Limit(rackwire::Limit::DatagramQueue),
            Error::BadHandle("x".into()),
            Error::Protocol("x".into()),
            Error::Config("x".into()),
            Error::Mh(MhErrorText { denied: true, not_found: false, text: "x".into() }),
            Error::sys("x", &std::io::Error::from(std::io::ErrorKind::Other)),
            Error::Closed,
            Error::Busy { region: 1 },
        ];
        for e in errors {
            let want = match e.kind() {
                ErrorKind::Refused => RwErrorKind::Refused,
                ErrorKind::Lost => RwErrorKind::Lost,
                ErrorKind::BadUse => RwErrorKind::BadUse,
                ErrorKind::Limit => RwErrorKind::Limit,
                ErrorKind::ManagementHost => RwErrorKind::ManagementHost,
                ErrorKind::System => RwErrorKind::System,
                ErrorKind::TryAgain => RwErrorKind::TryAgain,
                ErrorKind::Closed => RwErrorKind::Closed,
                other => panic!("a kind C does not name: {other:?}"),
            };
            assert_eq!(rw_status_kind(status_of(&e) as c_int), want, "{e}");
        }
        assert_eq!(rw_status_kind(RwStatus::Ok as c_int), RwErrorKind::None);
        assert_eq!(rw_status_kind(RwStatus::RankGone as c_int), RwErrorKind::Lost);
        assert_eq!(rw_status_kind(RwStatus::BadArgument as c_int), RwErrorKind::BadUse);
        assert_eq!(rw_status_kind(RwStatus::NotReady as c_int), RwErrorKind::TryAgain);
        assert_eq!(rw_status_kind(RwStatus::Internal as c_int), RwErrorKind::Internal);
        assert_eq!(rw_status_kind(999), RwErrorKind::Internal);
    }
}
