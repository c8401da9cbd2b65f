//! One exception class per error, all under `RackwireError`, grouped under the three kinds a
//! caller handles alike (`rackwire::ErrorKind`): `AccessRefusedError`, `ConnectionLostError`,
//! `BadUseError`.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use rackwire::Error;
use rackwire_coll::CollError;

create_exception!(rackwire, RackwireError, PyException, "Every error rackwire raises.");
create_exception!(
    rackwire,
    AccessRefusedError,
    RackwireError,
    "The target's rules refused the operation; nothing of the target was touched."
);
create_exception!(
    rackwire,
    ConnectionLostError,
    RackwireError,
    "The peer is gone, unreachable, broke the protocol or did not answer in time."
);
create_exception!(rackwire, BadUseError, RackwireError, "The call itself was wrong: retrying it fails the same way.");
create_exception!(
    rackwire,
    UngrantedError,
    AccessRefusedError,
    "The owner has not granted the access the operation needs."
);
create_exception!(rackwire, RevokedError, AccessRefusedError, "The owner revoked the grant.");
create_exception!(rackwire, OutOfBoundsError, AccessRefusedError, "The range lies (partly) outside the region.");
create_exception!(rackwire, MisalignedError, AccessRefusedError, "An atomic at an offset that is not 8-byte aligned.");
create_exception!(rackwire, BadKeyError, AccessRefusedError, "The handle's key does not match: forged or stale.");
create_exception!(rackwire, UnknownRegionError, AccessRefusedError, "The owner has no such region.");
create_exception!(rackwire, UnknownPeerError, BadUseError, "No such node.");
create_exception!(rackwire, PeerGoneError, ConnectionLostError, "The peer went away.");
create_exception!(rackwire, UnreachableError, ConnectionLostError, "No transport reaches the peer.");
create_exception!(rackwire, TimeoutError, ConnectionLostError, "The operation did not complete in time.");
create_exception!(rackwire, MessageTooLargeError, BadUseError, "A message above the limit.");
create_exception!(rackwire, LimitError, RackwireError, "A limit was reached (regions, peers, batch entries, ranks).");
create_exception!(rackwire, BadHandleError, BadUseError, "A region handle could not be parsed.");
create_exception!(
    rackwire,
    ProtocolError,
    ConnectionLostError,
    "The peer failed authentication or broke the protocol."
);
create_exception!(rackwire, ConfigError, BadUseError, "Bad configuration.");
create_exception!(rackwire, ManagementHostError, RackwireError, "The management host refused or could not be reached.");
create_exception!(rackwire, SystemResourceError, RackwireError, "A system resource failed.");
create_exception!(rackwire, ClosedError, RackwireError, "The fabric was closed.");
create_exception!(rackwire, BusyError, RackwireError, "The region is moving to fresh memory: try again shortly.");
create_exception!(rackwire, RankGoneError, ConnectionLostError, "A rank of the group is gone.");
create_exception!(rackwire, BadArgumentError, BadUseError, "Arguments that do not fit together.");

/// The exception for a Rust error.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::Ungranted { .. } => UngrantedError::new_err(msg),
        Error::Revoked { .. } => RevokedError::new_err(msg),
        Error::OutOfBounds { .. } => OutOfBoundsError::new_err(msg),
        Error::Misaligned { .. } => MisalignedError::new_err(msg),
        Error::BadKey { .. } => BadKeyError::new_err(msg),
        Error::UnknownRegion { .. } => UnknownRegionError::new_err(msg),
        Error::UnknownPeer(_) => UnknownPeerError::new_err(msg),
        Error::PeerGone(_) => PeerGoneError::new_err(msg),
        Error::Unreachable { .. } => UnreachableError::new_err(msg),
        Error::Timeout => TimeoutError::new_err(msg),
        Error::MessageTooLarge { .. } => MessageTooLargeError::new_err(msg),
        Error::Limit(_) => LimitError::new_err(msg),
        Error::BadHandle(_) => BadHandleError::new_err(msg),
        Error::Protocol(_) => ProtocolError::new_err(msg),
        Error::Config(_) => ConfigError::new_err(msg),
        Error::Mh(_) => ManagementHostError::new_err(msg),
        Error::Sys { .. } => SystemResourceError::new_err(msg),
        Error::Closed => ClosedError::new_err(msg),
        Error::Busy { .. } => BusyError::new_err(msg),
    }
}

/// The exception for a group's error.
pub(crate) fn coll_to_py(e: CollError) -> PyErr {
    let msg = e.to_string();
    match e {
        CollError::Fabric(e) => to_py(e),
        CollError::RankGone { .. } => RankGoneError::new_err(msg),
        CollError::Timeout { .. } => TimeoutError::new_err(msg),
        CollError::Limit(_) => LimitError::new_err(msg),
        CollError::Config(_) => ConfigError::new_err(msg),
        CollError::BadArgument(_) => BadArgumentError::new_err(msg),
    }
}

/// A `BadArgumentError` saying `msg`.
pub(crate) fn bad(msg: impl Into<String>) -> PyErr {
    BadArgumentError::new_err(msg.into())
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    macro_rules! add {
        ($($e:ident),*) => { $( m.add(stringify!($e), py.get_type::<$e>())?; )* };
    }
    add!(
        RackwireError,
        AccessRefusedError,
        ConnectionLostError,
        BadUseError,
        UngrantedError,
        RevokedError,
        OutOfBoundsError,
        MisalignedError,
        BadKeyError,
        UnknownRegionError,
        UnknownPeerError,
        PeerGoneError,
        UnreachableError,
        TimeoutError,
        MessageTooLargeError,
        LimitError,
        BadHandleError,
        ProtocolError,
        ConfigError,
        ManagementHostError,
        SystemResourceError,
        ClosedError,
        BusyError,
        RankGoneError,
        BadArgumentError
    );
    Ok(())
}
