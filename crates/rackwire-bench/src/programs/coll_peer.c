/* The Open MPI side of `rackwire bench coll`: the same collectives, sizes and method as
 * rackwire's ranks (the OSU micro-benchmarks' method: warm-up iterations, then timed
 * iterations each preceded by a barrier; each rank averages its own time per call; the
 * figures are the average, minimum and maximum of those over the ranks).
 *
 * Run as Open MPI's users run it: built with mpicc, started with mpirun, default transports
 * (shared memory between the ranks of one machine). alltoallv uses the OSU benchmark's counts:
 * SIZE bytes to and from every rank, displacements packed.
 *
 * The warm-up is WARMUP calls, then more until WARMUP_MS milliseconds have passed, as many on
 * every rank (the slowest rank's time per call decides): the rule rackwire's ranks follow.
 *
 * usage: coll_peer OP SIZE ITERS WARMUP WARMUP_MS
 *        (OP: barrier, bcast, scatter, alltoallv, allreduce)
 * prints, at rank 0: ROW op size iters avg_us min_us max_us
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Calls a warm-up gains from WARMUP_MS at most (as rackwire's harness). */
#define WARMUP_EXTRA_MAX 100000

/* One call of collective OP with blocks of SIZE bytes. */
static void call(const char *op, int rank, long size, char *sbuf, char *rbuf, int *counts, int *displs,
                 int floats) {
    if (!strcmp(op, "barrier")) {
        MPI_Barrier(MPI_COMM_WORLD);
    } else if (!strcmp(op, "bcast")) {
        MPI_Bcast(sbuf, (int)size, MPI_CHAR, 0, MPI_COMM_WORLD);
    } else if (!strcmp(op, "scatter")) {
        MPI_Scatter(sbuf, (int)size, MPI_CHAR, rbuf, (int)size, MPI_CHAR, 0, MPI_COMM_WORLD);
    } else if (!strcmp(op, "alltoallv")) {
        MPI_Alltoallv(sbuf, counts, displs, MPI_CHAR, rbuf, counts, displs, MPI_CHAR, MPI_COMM_WORLD);
    } else if (!strcmp(op, "allreduce")) {
        MPI_Allreduce(sbuf, rbuf, floats, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else {
        if (rank == 0) fprintf(stderr, "unknown op %s\n", op);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 6) {
        if (rank == 0) fprintf(stderr, "usage: coll_peer OP SIZE ITERS WARMUP WARMUP_MS\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *op = argv[1];
    long size = atol(argv[2]);
    int iters = atoi(argv[3]), warmup = atoi(argv[4]);
    double warmup_min = atof(argv[5]) / 1e3;
    char *sbuf = calloc((size_t)size * n + 64, 1);
    char *rbuf = calloc((size_t)size * n + 64, 1);
    /* What is sent is written first, as the OSU benchmarks do and rackwire's ranks do: a
     * buffer never written is the kernel's one zero page, always in the cache, and reading it
     * (or copying from it through the kernel) costs far less than reading real data. */
    if (!sbuf || !rbuf) {
        fprintf(stderr, "coll_peer: out of memory for %ld-byte blocks\n", size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(sbuf, 1, (size_t)size * n + 64);
    int *counts = malloc(sizeof(int) * n), *displs = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) {
        counts[i] = (int)size;
        displs[i] = (int)(size * i);
    }
    int floats = size / 4 > 0 ? (int)(size / 4) : 1;
    double t = MPI_Wtime();
    for (int i = 0; i < warmup; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        call(op, rank, size, sbuf, rbuf, counts, displs, floats);
    }
    double spent = MPI_Wtime() - t, slowest;
    MPI_Allreduce(&spent, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long extra = 0;
    if (slowest < warmup_min) {
        double per_call = slowest / (warmup > 0 ? warmup : 1);
        extra = per_call > 0 ? (long)((warmup_min - slowest) / per_call + 0.999999) : WARMUP_EXTRA_MAX;
        if (extra > WARMUP_EXTRA_MAX) extra = WARMUP_EXTRA_MAX;
    }
    for (long i = 0; i < extra; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        call(op, rank, size, sbuf, rbuf, counts, displs, floats);
    }
    double total = 0.0;
    for (int i = 0; i < iters; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        call(op, rank, size, sbuf, rbuf, counts, displs, floats);
        total += MPI_Wtime() - t0;
    }
    double mine = total * 1e6 / iters, avg, min, max;
    MPI_Reduce(&mine, &avg, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&mine, &min, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&mine, &max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("ROW %s %ld %d %.3f %.3f %.3f\n", op, size, iters, avg / n, min, max);
    free(sbuf);
    free(rbuf);
    free(counts);
    free(displs);
    MPI_Finalize();
    return 0;
}
