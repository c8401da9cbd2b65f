"""A rank of the collectives test: every collective of rackwire.Group, checked at every rank."""

import threading
import time

import numpy as np

import rackwire

with rackwire.Group() as g:
    r, n = g.rank, g.size
    g.barrier()
    # A collective lets go of the GIL while it waits: another thread of a rank kept waiting
    # 0.3 s in a barrier (rank 0 comes late) runs meanwhile.
    ticks, stop = [0], threading.Event()

    def tick():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick)
    ticker.start()
    if r == 0:
        time.sleep(0.3)
    g.barrier()
    stop.set()
    ticker.join()
    assert r == 0 or ticks[0] >= 20, f"another thread ran {ticks[0]} times while the barrier waited"
    buf = np.full(8, r, dtype=np.int32)
    g.bcast(1 % n, buf)
    assert (buf == 1 % n).all(), buf
    for dtype in (np.uint32, np.uint64, np.int32, np.int64, np.float32, np.float64):
        a = np.array([r + 1, 2], dtype=dtype)
        g.allreduce(a, "sum")
        assert a[0] == n * (n + 1) // 2 and a[1] == 2 * n, (dtype, a)
    m = np.array([r], dtype=np.int64)
    g.allreduce(m, "min")
    assert m[0] == 0
    p = np.array([2.0], dtype=np.float64)
    g.allreduce(p, "prod")
    assert p[0] == 2.0**n
    assert g.allgather(bytes([r])) == bytes(range(n))
    send = bytes(r * 10 + j for j in range(n))
    assert g.alltoall(send) == bytes(j * 10 + r for j in range(n))
    root = n - 1  # not rank 0: any root works
    val = lambda frm, to, i: (frm * 31 + to * 7 + i) % 256  # byte i of what rank frm gives rank to
    vcount = lambda frm, to: (frm + 2 * to) % 4 + 1  # bytes frm gives to in the v-collectives
    red = np.array([r + 1, 2], dtype=np.int64)
    g.reduce(root, red, "sum")
    if r == root:
        assert red[0] == n * (n + 1) // 2 and red[1] == 2 * n, red
    rmax = np.array([r * 3], dtype=np.uint32)
    g.reduce(root, rmax, "max")
    if r == root:
        assert rmax[0] == (n - 1) * 3, rmax
    recv = np.zeros(4, dtype=np.uint8)
    blocks = bytes(val(root, j, i) for j in range(n) for i in range(4))
    g.scatter(root, blocks if r == root else None, recv)
    assert bytes(recv) == bytes(val(root, r, i) for i in range(4)), recv
    counts = [vcount(root, j) for j in range(n)]
    packed = bytes(val(root, j, i) for j in range(n) for i in range(counts[j]))
    mine = bytearray(vcount(root, r))
    g.scatterv(root, packed if r == root else None, counts if r == root else None, mine)
    assert bytes(mine) == bytes(val(root, r, i) for i in range(vcount(root, r))), mine
    got = np.zeros(4 * n, dtype=np.uint8) if r == root else None
    g.gather(root, bytes(val(r, root, i) for i in range(4)), got)
    if r == root:
        assert bytes(got) == bytes(val(j, root, i) for j in range(n) for i in range(4)), got
    gcounts = [vcount(j, root) for j in range(n)]
    gv = bytearray(sum(gcounts)) if r == root else None
    g.gatherv(root, bytes(val(r, root, i) for i in range(vcount(r, root))), gcounts if r == root else None, gv)
    if r == root:
        assert bytes(gv) == bytes(val(j, root, i) for j in range(n) for i in range(gcounts[j])), gv
    acounts = [vcount(j, 0) for j in range(n)]
    assert g.allgatherv(bytes(val(r, 0, i) for i in range(acounts[r])), acounts) == bytes(
        val(j, 0, i) for j in range(n) for i in range(acounts[j])
    )
    sc = [vcount(r, j) for j in range(n)]
    rc = [vcount(j, r) for j in range(n)]
    sendv = bytes(val(r, j, i) for j in range(n) for i in range(sc[j]))
    assert g.alltoallv(sendv, sc, rc) == bytes(val(j, r, i) for j in range(n) for i in range(rc[j]))
    try:
        g.scatter(r, None, recv)  # this rank as root, giving nothing
        raise AssertionError("a root without a send buffer was accepted")
    except rackwire.BadArgumentError:
        pass
    try:
        g.alltoallv(b"", [0] * n, [1 << 40] * n)
        raise AssertionError("a count past the block limit was accepted")
    except rackwire.BadArgumentError:
        pass
    try:
        g.allreduce(np.zeros(2, dtype=np.complex128))
        raise AssertionError("complex numbers were accepted")
    except rackwire.BadArgumentError:
        pass
    print("group ok", r)
