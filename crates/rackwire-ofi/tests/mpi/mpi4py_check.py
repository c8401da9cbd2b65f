"""mpi4py over the rackwire provider: pickled objects (sendrecv, which matches with a
matched probe), numpy buffers (Allreduce, Bcast) and a collective of Python objects
(allreduce), each checked against what this rank computes itself; rank 0 prints
"mpi4py ok N" when every rank's checks held. (One-sided is checked from C: mpi_check.c.)"""
from mpi4py import MPI
import numpy as np

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()

assert comm.allreduce(rank + 1, op=MPI.SUM) == size * (size + 1) // 2

a = np.full(1 << 18, rank, dtype=np.float64)
b = np.empty_like(a)
comm.Allreduce(a, b, op=MPI.SUM)
assert (b == sum(range(size))).all()

got = comm.sendrecv(("hello", rank, list(range(rank))), dest=(rank + 1) % size, source=(rank - 1) % size)
prev = (rank - 1) % size
assert got == ("hello", prev, list(range(prev))), got

c = np.arange(1 << 16, dtype=np.int32) if rank == size - 1 else np.zeros(1 << 16, dtype=np.int32)
comm.Bcast(c, root=size - 1)
assert (c == np.arange(1 << 16, dtype=np.int32)).all()

ok = comm.allreduce(1, op=MPI.SUM)
if rank == 0:
    print("mpi4py ok", ok)
