"""A parallel sum over the ranks of a job, with numpy arrays and one allreduce.

    rackwire launch -n 4 -- python3 examples/python/allreduce.py

Each rank fills its share of a million numbers, sums it, and the ranks add their sums with
allreduce; every rank checks the total against the formula, rank 0 prints it.
"""

import numpy as np

import rackwire

N = 1_000_000

with rackwire.Group() as g:
    share = np.arange(g.rank, N, g.size, dtype=np.float64)  # this rank's numbers
    total = np.array([share.sum(), share.size], dtype=np.float64)
    g.allreduce(total, "sum")
    assert total[0] == N * (N - 1) / 2 and total[1] == N, total
    biggest = np.array([share.max()], dtype=np.float64)
    g.allreduce(biggest, "max")
    if g.rank == 0:
        print(f"{g.size} ranks: sum of 0..{N - 1} = {total[0]:.0f}, max {biggest[0]:.0f}")
