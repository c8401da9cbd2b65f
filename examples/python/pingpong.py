"""Ping-pong and one-way bandwidth between two processes, from Python (the same protocol as
examples/c/pingpong.c and `rackwire lang-worker`, so `rackwire bench lang` can set them side
by side).

    python3 pingpong.py server ITERS     | python3 pingpong.py client ITERS
    python3 pingpong.py bw-server ITERS  | python3 pingpong.py bw-client ITERS

Both need RACKWIRE_MH, RACKWIRE_SECRET (or _FILE) and a RACKWIRE_NAME of their own.
"""

import sys
import time

import rackwire

BW_BYTES = 1 << 20


def lookup(fabric, name):
    for _ in range(3000):
        try:
            return fabric.lookup(name)
        except rackwire.ManagementHostError:
            time.sleep(0.01)
    return fabric.lookup(name)


def pingpong(fabric, server, iters):
    mine = fabric.alloc(4096, "rw")
    mine.publish("c-pingpong/server" if server else "c-pingpong/client")
    peer = lookup(fabric, "c-pingpong/client" if server else "c-pingpong/server")
    mine.grant(peer.node, "w")
    conn = fabric.connect(peer.node)
    view = memoryview(mine).cast("Q")  # the region's memory as 64-bit words, no copy
    conn.send(b"granted")
    assert fabric.recv(30.0)[1] == b"granted"
    t0 = time.perf_counter()
    for i in range(iters):
        if not server:
            conn.put_u64(peer, 0, i, notify=i)
        n = fabric.wait_notification(30.0)
        if n.imm != i or view[0] != i:
            sys.exit(f"round {i}: notified {n.imm}, found {view[0]}")
        if server:
            conn.put_u64(peer, 0, i, notify=i)
    t1 = time.perf_counter()
    if not server:
        print(f"pingpong {iters} rounds, one-way latency {(t1 - t0) / iters / 2 * 1e6:.3f} us")
    conn.send(b"bye")
    assert fabric.recv(30.0)[1] == b"bye"


def bandwidth(fabric, server, iters):
    if server:
        region = fabric.alloc(BW_BYTES, "rw")
        region.publish("lang-bw/server")
        frm, data = fabric.recv(30.0)
        assert data == b"hello"
        region.grant(frm, "w")
        conn = fabric.connect(frm)
        conn.send(b"granted")
        assert fabric.recv(60.0)[1] == b"done"
        return
    # numpy only here: importing it starts OpenBLAS's worker threads, which spin for a while
    # and take a core from the ping-pong on a small machine.
    import numpy as np

    target = lookup(fabric, "lang-bw/server")
    conn = fabric.connect(target.node)
    conn.send(b"hello")
    assert fabric.recv(30.0)[1] == b"granted"
    data = np.ones(BW_BYTES, dtype=np.uint8)
    conn.write(target, 0, data).wait()  # warm-up: the mapping is made
    t0 = time.perf_counter()
    for _ in range(iters):
        conn.write(target, 0, data).wait()
    t1 = time.perf_counter()
    print(f"bandwidth {iters} writes of {BW_BYTES} bytes, {BW_BYTES * iters / (t1 - t0) / 1e6:.1f} MB/s")
    conn.send(b"done")


def main():
    role, iters = sys.argv[1], int(sys.argv[2])
    fabric = rackwire.Fabric()
    if role in ("server", "client"):
        pingpong(fabric, role == "server", iters)
    elif role in ("bw-server", "bw-client"):
        bandwidth(fabric, role == "bw-server", iters)
    else:
        sys.exit(f"unknown role {role}")


if __name__ == "__main__":
    main()
