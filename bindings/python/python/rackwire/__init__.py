"""rackwire: a rack-area network stack in software.

Join a fabric, allocate regions of memory, grant them to peers, and move data with one-sided
writes, reads and atomics, over shared memory between processes that share a machine and over
a reliable multi-link transport between machines. ``memoryview(region)`` and
``numpy.frombuffer(region, dtype)`` see a region's memory without a copy. Every error is a
subclass of :class:`RackwireError`, one class per error, grouped by how a caller handles it:
:class:`AccessRefusedError` (the target's rules refused; nothing was touched),
:class:`ConnectionLostError` (the peer is gone or did not answer) and :class:`BadUseError` (the
call itself was wrong).
"""

from ._rackwire import (  # noqa: F401
    __version__,
    AccessRefusedError,
    BadArgumentError,
    BadHandleError,
    BadKeyError,
    BadUseError,
    BusyError,
    ClosedError,
    Conn,
    ConfigError,
    ConnectionLostError,
    Fabric,
    Group,
    LimitError,
    ManagementHost,
    ManagementHostError,
    MessageTooLargeError,
    MisalignedError,
    Notification,
    Op,
    OutOfBoundsError,
    PeerGoneError,
    ProtocolError,
    RackwireError,
    RankGoneError,
    Region,
    RemoteRegion,
    RevokedError,
    SystemResourceError,
    TimeoutError,
    UngrantedError,
    UnknownPeerError,
    UnknownRegionError,
    UnreachableError,
)

__all__ = [name for name in dir() if not name.startswith("_")]
