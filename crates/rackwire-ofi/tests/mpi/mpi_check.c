/*
 * An MPI program run by Open MPI over the rackwire provider (pml cm, mtl ofi; one-sided
 * through osc pt2pt on top of it, or through osc rdma on btl ofi: the provider's own
 * writes, reads and atomics). Every result is checked against what this rank computes
 * itself; a mismatch names the check and aborts the job. Covers point-to-point (blocking,
 * non-blocking, synchronous, wildcard source and tag, probe and iprobe, matched probes,
 * 4 MiB messages),
 * the collectives (barrier, bcast, reduce, allreduce, gather(v), scatter(v), allgather(v),
 * alltoall(v), reduce_scatter(_block), scan, exscan), and one-sided (put, get, accumulate
 * under fence; fetch-and-op and compare-and-swap under lock). With the argument "die", rank
 * 1 kills itself midway: mpirun must then fail, not hang. With "no-self-cas" the window's
 * owner does not compare-and-swap on its own window (Open MPI 4.1.4's `osc rdma` hands the
 * network a null key for a rank's own window on one host and crashes in `btl ofi` before
 * any provider is called; fixed in Open MPI 4.1.5), every other rank still does.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size;
/* Whether rank 0 stays out of the compare-and-swap contest on its own window. */
static int no_self_cas;

#define CHECK(cond, ...)                                                  \
	do {                                                              \
		if (!(cond)) {                                            \
			fprintf(stderr, "rank %d: check failed at line %d: ", rank, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                     \
			fprintf(stderr, "\n");                            \
			MPI_Abort(MPI_COMM_WORLD, 1);                     \
		}                                                         \
	} while (0)

static long pattern(int who, long i) { return who * 1000003L + i * 7; }

static void point_to_point(void)
{
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;
	long out = pattern(rank, 1), in = -1;
	MPI_Status st;
	MPI_Sendrecv(&out, 1, MPI_LONG, next, 11, &in, 1, MPI_LONG, prev, 11, MPI_COMM_WORLD, &st);
	CHECK(in == pattern(prev, 1), "sendrecv got %ld", in);

	/* Non-blocking, wildcard source and tag: rank 0 hears from everyone, in any order. */
	if (rank == 0) {
		long got[64] = { 0 };
		for (int i = 1; i < size; i++) {
			long v;
			MPI_Request r;
			MPI_Irecv(&v, 1, MPI_LONG, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &r);
			MPI_Wait(&r, &st);
			CHECK(st.MPI_TAG == 100 + st.MPI_SOURCE && v == pattern(st.MPI_SOURCE, 2), "wildcard from %d tag %d",
			      st.MPI_SOURCE, st.MPI_TAG);
			got[st.MPI_SOURCE]++;
		}
		for (int i = 1; i < size; i++)
			CHECK(got[i] == 1, "rank %d heard %ld times", i, got[i]);
	} else {
		long v = pattern(rank, 2);
		MPI_Request r;
		MPI_Isend(&v, 1, MPI_LONG, 0, 100 + rank, MPI_COMM_WORLD, &r);
		MPI_Wait(&r, MPI_STATUS_IGNORE);
	}

	/* Probe a 4 MiB message's size, then receive it; iprobe until the next one is there. */
	size_t n = (size_t)4 << 20;
	long *big = malloc(n);
	int count = n / sizeof(long);
	if (rank == 0) {
		for (int i = 0; i < count; i++)
			big[i] = pattern(0, i);
		for (int dst = 1; dst < size; dst++)
			MPI_Ssend(big, count, MPI_LONG, dst, 7, MPI_COMM_WORLD);
		for (int dst = 1; dst < size; dst++)
			MPI_Send(big, 3, MPI_LONG, dst, 8, MPI_COMM_WORLD);
	} else {
		int got = 0, flag = 0;
		MPI_Probe(0, 7, MPI_COMM_WORLD, &st);
		MPI_Get_count(&st, MPI_LONG, &got);
		CHECK(got == count, "probe saw %d longs", got);
		memset(big, 0, n);
		MPI_Recv(big, count, MPI_LONG, 0, 7, MPI_COMM_WORLD, &st);
		for (int i = 0; i < count; i++)
			CHECK(big[i] == pattern(0, i), "4 MiB message, long %d", i);
		for (int i = 0; i < 10000000 && !flag; i++)
			MPI_Iprobe(0, 8, MPI_COMM_WORLD, &flag, &st);
		CHECK(flag, "iprobe never saw the message");
		MPI_Recv(big, 3, MPI_LONG, 0, 8, MPI_COMM_WORLD, &st);
		CHECK(big[2] == pattern(0, 2), "after iprobe");
	}
	free(big);

	/* Matched probe (MPI_Mprobe, MPI_Improbe) and the receive of what it matched. */
	if (rank == 0) {
		for (int dst = 1; dst < size; dst++) {
			long v = pattern(dst, 9), w = pattern(dst, 10);
			MPI_Send(&v, 1, MPI_LONG, dst, 9, MPI_COMM_WORLD);
			MPI_Send(&w, 1, MPI_LONG, dst, 10, MPI_COMM_WORLD);
		}
	} else {
		MPI_Message m;
		long v = -1;
		int got = 0, flag = 0;
		MPI_Mprobe(0, 9, MPI_COMM_WORLD, &m, &st);
		MPI_Get_count(&st, MPI_LONG, &got);
		MPI_Mrecv(&v, 1, MPI_LONG, &m, &st);
		CHECK(got == 1 && v == pattern(rank, 9) && st.MPI_TAG == 9, "mprobe/mrecv got %ld", v);
		for (int i = 0; i < 10000000 && !flag; i++)
			MPI_Improbe(MPI_ANY_SOURCE, 10, MPI_COMM_WORLD, &flag, &m, &st);
		CHECK(flag && st.MPI_SOURCE == 0, "improbe never matched");
		MPI_Mrecv(&v, 1, MPI_LONG, &m, MPI_STATUS_IGNORE);
		CHECK(v == pattern(rank, 10), "improbe/mrecv got %ld", v);
	}
}

static void collectives(void)
{
	int n = size;
	long *send = calloc(4 * n * n + 64, sizeof(long)), *recv = calloc(4 * n * n + 64, sizeof(long));
	int *counts = calloc(n, sizeof(int)), *displs = calloc(n, sizeof(int));
	int *rcounts = calloc(n, sizeof(int)), *rdispls = calloc(n, sizeof(int));

	MPI_Barrier(MPI_COMM_WORLD);
	long b = rank == n - 1 ? 4242 : 0;
	MPI_Bcast(&b, 1, MPI_LONG, n - 1, MPI_COMM_WORLD);
	CHECK(b == 4242, "bcast %ld", b);

	long v = rank + 1, sum = 0, max = 0;
	MPI_Reduce(&v, &sum, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
	CHECK(rank != 0 || sum == (long)n * (n + 1) / 2, "reduce %ld", sum);
	MPI_Allreduce(&v, &max, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
	CHECK(max == n, "allreduce max %ld", max);
	double d = 0.5 * rank, dsum = 0;
	MPI_Allreduce(&d, &dsum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	CHECK(dsum == 0.25 * n * (n - 1), "allreduce double %f", dsum);

	/* Gather(v) and scatter(v): rank r contributes r + 1 values. */
	long mine[64];
	for (int i = 0; i <= rank; i++)
		mine[i] = pattern(rank, i);
	int total = 0;
	for (int r = 0; r < n; r++) {
		counts[r] = r + 1;
		displs[r] = total;
		total += r + 1;
	}
	MPI_Gatherv(mine, rank + 1, MPI_LONG, recv, counts, displs, MPI_LONG, 0, MPI_COMM_WORLD);
	if (rank == 0)
		for (int r = 0; r < n; r++)
			for (int i = 0; i <= r; i++)
				CHECK(recv[displs[r] + i] == pattern(r, i), "gatherv from %d", r);
	MPI_Allgatherv(mine, rank + 1, MPI_LONG, recv, counts, displs, MPI_LONG, MPI_COMM_WORLD);
	for (int r = 0; r < n; r++)
		for (int i = 0; i <= r; i++)
			CHECK(recv[displs[r] + i] == pattern(r, i), "allgatherv from %d", r);
	for (int r = 0; r < n; r++)
		for (int i = 0; i <= r; i++)
			send[displs[r] + i] = pattern(100 + r, i);
	MPI_Scatterv(send, counts, displs, MPI_LONG, recv, rank + 1, MPI_LONG, 0, MPI_COMM_WORLD);
	for (int i = 0; i <= rank; i++)
		CHECK(recv[i] == pattern(100 + rank, i), "scatterv");
	long one = pattern(rank, 5);
	MPI_Gather(&one, 1, MPI_LONG, recv, 1, MPI_LONG, 0, MPI_COMM_WORLD);
	if (rank == 0)
		for (int r = 0; r < n; r++)
			CHECK(recv[r] == pattern(r, 5), "gather from %d", r);
	MPI_Allgather(&one, 1, MPI_LONG, recv, 1, MPI_LONG, MPI_COMM_WORLD);
	for (int r = 0; r < n; r++)
		CHECK(recv[r] == pattern(r, 5), "allgather from %d", r);
	for (int r = 0; r < n; r++)
		send[r] = pattern(200 + r, 0);
	MPI_Scatter(send, 1, MPI_LONG, &one, 1, MPI_LONG, 0, MPI_COMM_WORLD);
	CHECK(one == pattern(200 + rank, 0), "scatter");

	/* Alltoall(v): rank r sends (d + 1) values to rank d, each naming r and d. */
	for (int d = 0; d < n; d++)
		send[d] = pattern(rank, d);
	MPI_Alltoall(send, 1, MPI_LONG, recv, 1, MPI_LONG, MPI_COMM_WORLD);
	for (int s = 0; s < n; s++)
		CHECK(recv[s] == pattern(s, rank), "alltoall from %d", s);
	int so = 0, ro = 0;
	for (int d = 0; d < n; d++) {
		counts[d] = d + 1;
		displs[d] = so;
		for (int i = 0; i <= d; i++)
			send[so + i] = pattern(rank * 100 + d, i);
		so += d + 1;
		rcounts[d] = rank + 1;
		rdispls[d] = ro;
		ro += rank + 1;
	}
	MPI_Alltoallv(send, counts, displs, MPI_LONG, recv, rcounts, rdispls, MPI_LONG, MPI_COMM_WORLD);
	for (int s = 0; s < n; s++)
		for (int i = 0; i <= rank; i++)
			CHECK(recv[rdispls[s] + i] == pattern(s * 100 + rank, i), "alltoallv from %d", s);

	/* Reduce-scatter, scan, exscan. */
	for (int i = 0; i < n; i++) {
		send[i] = rank * 10 + i;
		counts[i] = 1;
	}
	MPI_Reduce_scatter(send, &one, counts, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	CHECK(one == 10L * n * (n - 1) / 2 + (long)n * rank, "reduce_scatter %ld", one);
	MPI_Reduce_scatter_block(send, &one, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	CHECK(one == 10L * n * (n - 1) / 2 + (long)n * rank, "reduce_scatter_block %ld", one);
	v = rank + 1;
	MPI_Scan(&v, &one, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	CHECK(one == (long)(rank + 1) * (rank + 2) / 2, "scan %ld", one);
	one = -1;
	MPI_Exscan(&v, &one, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	CHECK(rank == 0 || one == (long)rank * (rank + 1) / 2, "exscan %ld", one);
	free(send); free(recv); free(counts); free(displs); free(rcounts); free(rdispls);
}

static void one_sided(void)
{
	long *mem = calloc(8, sizeof(long));
	MPI_Win win;
	MPI_Win_create(mem, 8 * sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &win);
	int next = (rank + 1) % size, prev = (rank + size - 1) % size;

	MPI_Win_fence(0, win);
	long v = pattern(rank, 3), got = 0, add = rank + 1;
	MPI_Put(&v, 1, MPI_LONG, next, 0, 1, MPI_LONG, win);
	MPI_Accumulate(&add, 1, MPI_LONG, 0, 1, 1, MPI_LONG, MPI_SUM, win);
	MPI_Win_fence(0, win);
	CHECK(mem[0] == pattern(prev, 3), "put: %ld", mem[0]);
	CHECK(rank != 0 || mem[1] == (long)size * (size + 1) / 2, "accumulate: %ld", mem[1]);
	MPI_Get(&got, 1, MPI_LONG, next, 0, 1, MPI_LONG, win);
	MPI_Win_fence(0, win);
	CHECK(got == pattern(rank, 3), "get: %ld", got);

	/* Lock epochs on rank 0's window: each rank adds 1 and swaps its id in once. */
	long one = 1, old = -1, me = rank + 100, expected, result;
	MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
	MPI_Fetch_and_op(&one, &old, MPI_LONG, 0, 2, MPI_SUM, win);
	MPI_Win_unlock(0, win);
	CHECK(old >= 0 && old < size, "fetch_and_op old %ld", old);
	int swapped = 0, contenders = no_self_cas ? size - 1 : size;
	if (no_self_cas && rank == 0)
		swapped = -1;
	for (int tries = 0; tries < 100000 && !swapped; tries++) {
		MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
		MPI_Get(&expected, 1, MPI_LONG, 0, 3, 1, MPI_LONG, win);
		MPI_Win_flush(0, win);
		MPI_Compare_and_swap(&me, &expected, &result, MPI_LONG, 0, 3, win);
		MPI_Win_unlock(0, win);
		swapped = result == expected;
		if (swapped) {
			MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
			MPI_Accumulate(&one, 1, MPI_LONG, 0, 4, 1, MPI_LONG, MPI_SUM, win);
			MPI_Win_unlock(0, win);
		}
	}
	CHECK(swapped, "compare_and_swap never won");
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
		MPI_Win_unlock(0, win);
		CHECK(mem[2] == size, "fetch_and_op total %ld", mem[2]);
		CHECK(mem[4] == contenders, "compare_and_swap wins %ld", mem[4]);
		CHECK(mem[3] >= 100 + size - contenders && mem[3] < 100 + size, "last swapped in %ld", mem[3]);
	}
	MPI_Win_free(&win);
	free(mem);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	no_self_cas = argc > 1 && !strcmp(argv[1], "no-self-cas");
	point_to_point();
	if (argc > 1 && !strcmp(argv[1], "die")) {
		MPI_Barrier(MPI_COMM_WORLD);
		if (rank == 1)
			raise(SIGKILL);
		long v = 0;
		for (int i = 0; i < 1000; i++)
			MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	}
	collectives();
	one_sided();
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("mpi_check ok: %d ranks\n", size);
	MPI_Finalize();
	return 0;
}
