"""A rank of the collectives test: every collective of rackwire.Group, checked at every rank."""

import numpy as np

import rackwire

with rackwire.Group() as g:
    r, n = g.rank, g.size
    g.barrier()
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
    try:
        g.allreduce(np.zeros(2, dtype=np.complex128))
        raise AssertionError("complex numbers were accepted")
    except rackwire.BadArgumentError:
        pass
    print("group ok", r)
