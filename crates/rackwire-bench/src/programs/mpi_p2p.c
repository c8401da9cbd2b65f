/* The MPI program of `rackwire bench mpi`: the same program under Open MPI over each transport
 * (the rackwire libfabric provider, Open MPI's own shared memory `vader`, its `tcp`), so only
 * the transport differs. Measured as the OSU micro-benchmarks do it:
 *   pingpong  8 B messages between ranks 0 and 1, half the round trip (osu_latency);
 *   bw        1 MiB messages from rank 0 to 1, a window of 64 non-blocking sends, then an
 *             8-byte answer, bytes over time (osu_bw);
 *   allreduce 64 KiB of floats summed over every rank, the average time per call;
 *   alltoallv 64 KiB to and from every rank, the average time per call;
 *   put       1 MiB MPI_Put from rank 0 into rank 1's window, PUTS per passive-target epoch
 *             (lock, puts, unlock), bytes over time (osu_put_bw with lock/unlock).
 * Each measure has its warm-up iterations first; buffers are written before they are sent.
 * usage: mpi_p2p SCALE (1.0 = full iteration counts)
 * prints at rank 0: ROW name value
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SMALL 8
#define LARGE (1 << 20)
#define WINDOW 64
#define COLL (64 << 10)
#define PUTS 16

static int scaled(double scale, int n) {
    int v = (int)(n * scale);
    return v < 10 ? 10 : v;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    char *buf = malloc(LARGE * (size_t)WINDOW);
    char *rbuf = malloc((size_t)COLL * n);
    char *sbuf = malloc((size_t)COLL * n);
    memset(buf, 1, LARGE * (size_t)WINDOW);
    memset(sbuf, 2, (size_t)COLL * n);
    MPI_Request reqs[WINDOW];

    /* Ping-pong. */
    int iters = scaled(scale, 20000), warm = scaled(scale, 2000);
    double t0 = 0;
    if (rank < 2) {
        for (int i = 0; i < iters + warm; i++) {
            if (i == warm) t0 = MPI_Wtime();
            if (rank == 0) {
                MPI_Send(buf, SMALL, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                MPI_Recv(buf, SMALL, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, SMALL, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, SMALL, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
            }
        }
        if (rank == 0) printf("ROW pingpong_8B_us %.4f\n", (MPI_Wtime() - t0) * 1e6 / iters / 2);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* Bandwidth. */
    iters = scaled(scale, 40);
    warm = scaled(scale, 4) < 4 ? scaled(scale, 4) : 4;
    if (rank < 2) {
        for (int i = 0; i < iters + warm; i++) {
            if (i == warm) t0 = MPI_Wtime();
            for (int w = 0; w < WINDOW; w++) {
                if (rank == 0)
                    MPI_Isend(buf + (size_t)w * LARGE, LARGE, MPI_CHAR, 1, 2, MPI_COMM_WORLD, &reqs[w]);
                else
                    MPI_Irecv(buf + (size_t)w * LARGE, LARGE, MPI_CHAR, 0, 2, MPI_COMM_WORLD, &reqs[w]);
            }
            MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
            if (rank == 0)
                MPI_Recv(rbuf, 8, MPI_CHAR, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            else
                MPI_Send(rbuf, 8, MPI_CHAR, 0, 3, MPI_COMM_WORLD);
        }
        if (rank == 0)
            printf("ROW bw_1MiB_MBs %.1f\n", (double)LARGE * WINDOW * iters / (MPI_Wtime() - t0) / 1e6);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* One-sided puts into rank 1's window (rank 0's buffer is the source). */
    MPI_Win win;
    MPI_Win_create(buf, (MPI_Aint)LARGE * PUTS, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win);
    iters = scaled(scale, 40);
    warm = 2;
    if (rank == 0) {
        for (int i = 0; i < iters + warm; i++) {
            if (i == warm) t0 = MPI_Wtime();
            MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 1, 0, win);
            for (int w = 0; w < PUTS; w++)
                MPI_Put(buf + (size_t)w * LARGE, LARGE, MPI_CHAR, 1, (MPI_Aint)w * LARGE, LARGE, MPI_CHAR, win);
            MPI_Win_unlock(1, win);
        }
        printf("ROW put_1MiB_MBs %.1f\n", (double)LARGE * PUTS * iters / (MPI_Wtime() - t0) / 1e6);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);

    /* Allreduce and alltoallv. */
    int *counts = malloc(sizeof(int) * n), *displs = malloc(sizeof(int) * n);
    for (int r = 0; r < n; r++) {
        counts[r] = COLL;
        displs[r] = r * COLL;
    }
    iters = scaled(scale, 2000);
    warm = scaled(scale, 200);
    for (int i = 0; i < iters + warm; i++) {
        if (i == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        MPI_Allreduce(sbuf, rbuf, COLL / 4, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    if (rank == 0) printf("ROW allreduce_64KiB_us %.3f\n", (MPI_Wtime() - t0) * 1e6 / iters);
    for (int i = 0; i < iters + warm; i++) {
        if (i == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        MPI_Alltoallv(sbuf, counts, displs, MPI_CHAR, rbuf, counts, displs, MPI_CHAR, MPI_COMM_WORLD);
    }
    if (rank == 0) printf("ROW alltoallv_64KiB_us %.3f\n", (MPI_Wtime() - t0) * 1e6 / iters);
    free(buf); free(rbuf); free(sbuf); free(counts); free(displs);
    MPI_Finalize();
    return 0;
}
