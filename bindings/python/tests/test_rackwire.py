"""Tests of the rackwire Python package: every call, and every exception class.

Each test starts its own management host in this process and joins nodes to it; two nodes in
one process talk over shared memory as two processes would. A job of ranks is started with
the rackwire launcher named by RACKWIRE_BIN (the Rust test that runs these sets it).
"""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import rackwire

SECRET = "python-test-secret-of-enough-length"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


@pytest.fixture
def mh():
    host = rackwire.ManagementHost(SECRET)
    yield host
    host.stop()


def node(mh, name):
    return rackwire.Fabric(mh=mh.addr, secret=SECRET, name=name)


@pytest.fixture
def pair(mh):
    """An owner with a 4 KiB region granted to an initiator, and the initiator's connection."""
    owner, init = node(mh, "owner"), node(mh, "init")
    region = owner.alloc(4096, "rwa")
    region.grant(init.id, "rwa")
    return owner, init, region, init.connect(owner.id)


def test_region_is_zero_copy_memory(pair):
    # A remote write shows in numpy's view of the region (no copy), and a local numpy store
    # is what a remote read returns.
    owner, init, region, conn = pair
    view = np.frombuffer(region, dtype=np.uint64)
    assert len(region) == 4096 and view.size == 512
    conn.write(region.handle, 16, np.array([123456789], dtype=np.uint64)).wait()
    assert view[2] == 123456789
    mv = memoryview(region)
    mv[100:104] = b"abcd"
    assert conn.read(region.handle, 100, 4).wait() == b"abcd"
    assert region.read(100, 4) == b"abcd"
    region.write(200, bytearray(b"xyz"))
    assert bytes(mv[200:203]) == b"xyz"


def test_write_notify_atomics_batch(pair):
    # A write with a notification, fences, both atomics (old values returned), and a batch
    # whose notification comes once every piece is in place.
    owner, init, region, conn = pair
    h = region.handle
    op = conn.write(h, 64, b"hello", notify=42, fence_before=True, fence_after=True)
    assert op.wait() is None and op.done()
    n = owner.wait_notification(5.0)
    assert (n.from_node, n.region, n.offset, n.len, n.imm) == (init.id, region.id, 64, 5, 42)
    conn.write_wait(h, 72, b"again", notify=43)
    assert owner.wait_notification(5.0).imm == 43 and region.read(72, 5) == b"again"
    with pytest.raises(rackwire.OutOfBoundsError):
        conn.write_wait(h, 4095, b"xy")
    # One word, no buffer: placed little-endian, notified with its immediate; past the end
    # refused with the region unchanged.
    conn.put_u64(h, 80, 0x0102030405060708, notify=44)
    assert owner.wait_notification(5.0).imm == 44 and region.read(80, 8) == bytes([8, 7, 6, 5, 4, 3, 2, 1])
    with pytest.raises(rackwire.OutOfBoundsError):
        conn.put_u64(h, 4092, 1)
    assert region.read(4088, 8) == bytes(8)
    assert conn.fetch_add(h, 0, 5).wait() == 0
    assert conn.compare_swap(h, 0, 5, 9).wait() == 5
    assert conn.compare_swap(h, 0, 5, 1).wait() == 9  # failed swap: the value it found
    assert region.load_u64(0) == 9
    conn.write_batch(h, [(1000, b"aa"), (2000, memoryview(b"bb"))], notify=7).wait()
    assert region.read(1000, 2) == b"aa" and region.read(2000, 2) == b"bb"
    assert owner.wait_notification(5.0).imm == 7
    stats = conn.stats()
    assert stats["writes"] >= 2 and stats["atomics"] == 3
    # Shared memory's own counters are there, the edge transport's are not.
    assert "ring_full_waits" in stats and "frames_sent" not in stats


def test_write_signal_and_wait(pair):
    # Put-with-signal: the data, then the signal word set (and added to, atomically); the
    # owner's wait_u64 returns the word once it compares as asked, with the data in place. A
    # word that does not come gives TimeoutError; a bad comparison is a BadArgumentError;
    # a signal word out of bounds stores nothing, not even the data.
    owner, init, region, conn = pair
    h = region.handle
    conn.write_signal(h, 64, b"payload!", 8, 41).wait()
    assert region.wait_u64(8, ">=", 41, timeout=5.0) == 41
    assert region.read(64, 8) == b"payload!"
    conn.write_signal(h, 72, memoryview(b"more"), 8, 1, add=True).wait()
    assert region.wait_u64(8, "==", 42, timeout=5.0) == 42 and region.read(72, 4) == b"more"
    with pytest.raises(rackwire.TimeoutError):
        region.wait_u64(8, ">", 42, timeout=0.05)
    with pytest.raises(rackwire.BadArgumentError):
        region.wait_u64(8, "=>", 42)
    with pytest.raises(rackwire.OutOfBoundsError):
        conn.write_signal(h, 128, b"lost", 4096, 1).wait()
    assert region.read(128, 4) == bytes(4)


def test_messages_and_names(pair):
    # Messages both ways (from any peer, and from one connection), a datagram, and a region
    # found by name.
    owner, init, region, conn = pair
    conn.send(b"ping")
    frm, data = owner.recv(5.0)
    assert (frm, data) == (init.id, b"ping")
    owner.connect(init.id).send(np.frombuffer(b"pong", dtype=np.uint8))
    assert conn.recv(5.0) == b"pong"
    # A datagram arrives as a message (over shared memory nothing is lost); one past the
    # largest message is refused.
    conn.send_datagram(memoryview(b"dgram"))
    assert owner.recv(5.0) == (init.id, b"dgram")
    with pytest.raises(rackwire.MessageTooLargeError):
        conn.send_datagram(bytes(64 * 1024 + 1))
    region.publish("py-test/region")
    assert init.lookup("py-test/region") == region.handle
    region.unpublish("py-test/region")
    with pytest.raises(rackwire.ManagementHostError):
        init.lookup("py-test/region")


def test_handles_to_and_from_bytes_and_text(pair):
    owner, init, region, conn = pair
    h = region.handle
    assert rackwire.RemoteRegion.from_bytes(bytes(h)) == h
    assert rackwire.RemoteRegion.from_str(str(h)) == h
    assert (h.node, h.region, len(h)) == (owner.id, region.id, 4096)
    with pytest.raises(rackwire.BadHandleError):
        rackwire.RemoteRegion.from_str("rw1:not-a-handle")
    with pytest.raises(rackwire.BadHandleError):
        rackwire.RemoteRegion.from_bytes(b"short")


def test_refusals_are_their_own_classes_and_leave_the_target_unchanged(mh):
    # An ungranted write, a forged key, a revoked grant, out of bounds and misaligned atomics:
    # each its own exception class, and the owner's bytes unchanged by all of them.
    owner, init = node(mh, "owner"), node(mh, "init")
    region = owner.alloc(4096, "rwa")
    view = np.frombuffer(region, dtype=np.uint8)
    conn = init.connect(owner.id)
    with pytest.raises(rackwire.UngrantedError):
        conn.write(region.handle, 0, b"not granted").wait()
    forged = bytearray(bytes(region.handle))
    forged[-1] ^= 0x5A
    region.grant(init.id, "rwa")
    with pytest.raises(rackwire.BadKeyError):
        conn.write(rackwire.RemoteRegion.from_bytes(forged), 0, b"forged").wait()
    with pytest.raises(rackwire.OutOfBoundsError):
        conn.write(region.handle, 4090, b"0123456789").wait()
    with pytest.raises(rackwire.MisalignedError):
        conn.fetch_add(region.handle, 3, 1).wait()
    assert not view.any(), "refused operations changed the region"
    conn.write(region.handle, 0, b"ok").wait()
    assert region.revoke(init.id) in ("not_mapped", "unmapped", "cut_off")
    with pytest.raises(rackwire.RevokedError):
        conn.write(region.handle, 8, b"after revoke").wait()
    assert bytes(view[:2]) == b"ok" and not view[2:].any()


def test_a_served_regions_write_grant_cannot_read(mh):
    # A served region granted "w": the write lands in the owner's memory, the read of it is
    # refused (over shared memory a mapped region's writer could read it all).
    owner, init = node(mh, "owner"), node(mh, "init")
    region = owner.alloc(4096, "rwa", served=True)
    region.grant(init.id, "w")
    conn = init.connect(owner.id)
    conn.write(region.handle, 8, b"into-served").wait()
    assert region.read(8, 11) == b"into-served"
    with pytest.raises(rackwire.UngrantedError):
        conn.read(region.handle, 8, 11).wait()


def test_other_errors(mh):
    # Unknown peer, a timeout, a message too large, a limit, bad arguments, a wrong secret,
    # and a peer that left.
    a, b = node(mh, "a"), node(mh, "b")
    with pytest.raises(rackwire.UnknownPeerError):
        a.connect(999_999)
    with pytest.raises(rackwire.TimeoutError):
        a.recv(0.05)
    conn = a.connect(b.id)
    with pytest.raises(rackwire.MessageTooLargeError):
        conn.send(bytes(64 * 1024 + 1))
    region = b.alloc(4096)
    region.grant(a.id, "rw")
    with pytest.raises(rackwire.LimitError):
        conn.write_batch(region.handle, [(0, b"x")] * 70_000).wait()
    with pytest.raises(rackwire.BadArgumentError):
        b.alloc(4096, "rwz")
    with pytest.raises(rackwire.BadArgumentError):
        a.recv(-1.0)
    with pytest.raises(rackwire.ConfigError):
        b.alloc(0)
    with pytest.raises((rackwire.ManagementHostError, rackwire.ProtocolError)):
        rackwire.Fabric(mh=mh.addr, secret="wrong-secret-wrong-secret", name="intruder")
    h = region.handle
    del region, b
    with pytest.raises((rackwire.PeerGoneError, rackwire.UnknownRegionError, rackwire.ClosedError)):
        for _ in range(200):
            conn.write(h, 0, b"x").wait()
            time.sleep(0.01)


def test_every_error_kind_is_its_own_class():
    # One class per error kind of the Rust API, all under RackwireError, none the same.
    kinds = [
        "Ungranted", "Revoked", "OutOfBounds", "Misaligned", "BadKey", "UnknownRegion", "UnknownPeer",
        "PeerGone", "Unreachable", "Timeout", "MessageTooLarge", "Limit", "BadHandle", "Protocol",
        "Config", "ManagementHost", "SystemResource", "Closed", "Busy", "RankGone", "BadArgument",
    ]
    classes = [getattr(rackwire, k + "Error") for k in kinds]
    assert len(set(classes)) == len(kinds)
    for c in classes:
        assert issubclass(c, rackwire.RackwireError) and c is not rackwire.RackwireError
    # Grouped as the Rust API's ErrorKind groups them: one except clause per way of handling.
    groups = {
        rackwire.AccessRefusedError: ["Ungranted", "Revoked", "OutOfBounds", "Misaligned", "BadKey", "UnknownRegion"],
        rackwire.ConnectionLostError: ["PeerGone", "Unreachable", "Timeout", "Protocol", "RankGone"],
        rackwire.BadUseError: ["UnknownPeer", "MessageTooLarge", "BadHandle", "Config", "BadArgument"],
    }
    for group, members in groups.items():
        assert issubclass(group, rackwire.RackwireError)
        for k in kinds:
            assert issubclass(getattr(rackwire, k + "Error"), group) == (k in members), (group, k)


def test_waits_release_the_gil(pair):
    # A thread blocked in recv does not stop this thread from running Python.
    import threading

    owner, init, region, conn = pair
    got = []
    t = threading.Thread(target=lambda: got.append(owner.recv(5.0)))
    t.start()
    counted = sum(1 for _ in range(200_000))  # runs only if the waiting thread let go of the GIL
    conn.send(b"wake")
    t.join(10)
    assert counted == 200_000 and got == [(init.id, b"wake")]
    # Nor one waiting for a notification (it looks for one holding the GIL for 20 µs first).
    t = threading.Thread(target=lambda: got.append(owner.wait_notification(5.0).imm))
    t.start()
    counted = sum(1 for _ in range(200_000))
    conn.put_u64(region.handle, 0, 1, notify=99)
    t.join(10)
    assert counted == 200_000 and got[-1] == 99


def test_bad_input_at_the_boundary_is_an_error_not_a_crash(pair):
    # Bounds before allocation: a read of 2**62 bytes is refused, nothing allocated (it
    # aborted the interpreter). A timeout too long for the clock is a BadArgumentError (it was
    # a PanicException). A write whose source is the region itself, overlapping the
    # destination, copies as memmove does. A collective whose send and recv buffers share
    # memory is refused.
    owner, init, region, conn = pair
    with pytest.raises(rackwire.OutOfBoundsError):
        region.read(0, 2**62)
    with pytest.raises(rackwire.BadArgumentError):
        owner.recv(1e19)
    with pytest.raises(rackwire.BadArgumentError):
        conn.read(region.handle, 0, 8).wait(1e19)
    mv = memoryview(region)
    mv[0:8] = b"abcdefgh"
    region.write(2, mv[0:6])
    assert region.read(0, 8) == b"ababcdef"
    region.write(0, mv[2:8])
    assert region.read(0, 8) == b"abcdefef"


def test_an_operation_waited_for_in_one_thread_answers_done_in_another(mh, tmp_path):
    # Op.wait let go of the GIL while holding the handle's lock, so another thread's
    # op.done() (taking that lock with the GIL held) deadlocked both. Here an operation that
    # cannot finish soon (a write to a peer over the edge transport whose process is stopped)
    # is waited for in one thread while another asks done() 50 times, each within a second;
    # after the peer resumes, the wait returns.
    import signal
    import threading

    cfg = tmp_path / "peer.toml"
    cfg.write_text(
        f'mh = "{mh.addr}"\nsecret = "{SECRET}"\nname = "stalled"\ntransport = "edge"\n'
        'links = ["127.0.0.1:0"]\n'
    )
    me_cfg = tmp_path / "me.toml"
    me_cfg.write_text(
        f'mh = "{mh.addr}"\nsecret = "{SECRET}"\nname = "waiter"\ntransport = "edge"\n'
        'links = ["127.0.0.1:0"]\nop_timeout_ms = 20000\npeer_timeout_ms = 20000\n'
    )
    me = rackwire.Fabric(config=str(me_cfg))
    script = (
        "import sys, rackwire\n"
        "f = rackwire.Fabric(config=sys.argv[1])\n"
        "r = f.alloc(4096, 'rw')\n"
        "r.grant(int(sys.argv[2]), 'rw')\n"
        "print(r.handle, flush=True)\n"
        "sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(cfg), str(me.id)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        handle = rackwire.RemoteRegion.from_str(child.stdout.readline().strip())
        conn = me.connect(handle.node)
        conn.write(handle, 0, b"warm").wait(10.0)
        os.kill(child.pid, signal.SIGSTOP)
        # Stopped for sure (every thread) before the write goes out.
        for _ in range(500):
            with open(f"/proc/{child.pid}/stat") as st:
                if st.read().rsplit(")", 1)[1].split()[0] == "T":
                    break
            time.sleep(0.01)
        op = conn.write(handle, 0, b"x" * 1000)
        outcome = []

        def wait():
            try:
                outcome.append(("returned", op.wait(15.0)))
            except rackwire.RackwireError as e:
                outcome.append(("raised", repr(e)))

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.2)
        answers = []
        for _ in range(50):
            t0 = time.monotonic()
            answers.append(op.done())
            assert time.monotonic() - t0 < 1.0, "done() waited on the thread in wait()"
        os.kill(child.pid, signal.SIGCONT)
        waiter.join(20)
        assert not waiter.is_alive() and op.done()
        assert answers.count(False) >= 1, (answers, outcome)
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.close()
        child.wait(20)


@pytest.mark.skipif(not os.environ.get("RACKWIRE_BIN"), reason="needs the rackwire launcher (RACKWIRE_BIN)")
def test_group_collectives_under_the_launcher():
    # The example job: 4 ranks sum a million numbers with allreduce (every rank checks the
    # total); then every collective the class offers, checked at every rank.
    launcher = os.environ["RACKWIRE_BIN"]
    out = subprocess.run(
        [launcher, "launch", "-n", "4", "--", sys.executable, os.path.join(ROOT, "examples/python/allreduce.py")],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 ranks: sum of 0..999999 = 499999500000, max 999999" in out.stdout
    job = os.path.join(HERE, "group_job.py")
    out = subprocess.run([launcher, "launch", "-n", "3", "--", sys.executable, job], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("group ok") == 3, out.stdout
