/* The Open MPI side of `rackwire bench coll`: the same collectives, sizes and method as
 * rackwire's ranks (the OSU micro-benchmarks' method: warm-up iterations, then timed
 * iterations each preceded by a barrier; each rank averages its own time per call; the
 * figures are the average, minimum and maximum of those over the ranks).
 *
 * Run as Open MPI's users run it: built with mpicc, started with mpirun, default transports
 * (shared memory between the ranks of one machine). alltoallv uses the OSU benchmark's counts:
 * SIZE bytes to and from every rank, displacements packed.
 *
 * usage: coll_peer OP SIZE ITERS WARMUP    (OP: barrier, bcast, scatter, alltoallv, allreduce)
 * prints, at rank 0: ROW op size iters avg_us min_us max_us
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc != 5) {
        if (rank == 0) fprintf(stderr, "usage: coll_peer OP SIZE ITERS WARMUP\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *op = argv[1];
    long size = atol(argv[2]);
    int iters = atoi(argv[3]), warmup = atoi(argv[4]);
    char *sbuf = calloc((size_t)size * n + 64, 1);
    char *rbuf = calloc((size_t)size * n + 64, 1);
    int *counts = malloc(sizeof(int) * n), *displs = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) {
        counts[i] = (int)size;
        displs[i] = (int)(size * i);
    }
    int floats = size / 4 > 0 ? (int)(size / 4) : 1;
    double total = 0.0;
    for (int i = 0; i < warmup + iters; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
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
        if (i >= warmup) total += MPI_Wtime() - t0;
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
