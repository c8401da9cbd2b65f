/*
 * Every collective of the C interface, at every rank of a job, each result checked against one
 * computed here (what rank `from` gives rank `to` is a function of both):
 *
 *     rackwire launch -n 3 -- ./collectives
 *
 * (or under mpirun, srun, or with RACKWIRE_RANK, RACKWIRE_SIZE and RACKWIRE_JOB set by hand).
 * The root of the rooted ones is the last rank, not rank 0. Prints "collectives ok RANK" and
 * exits 0 when every check holds.
 */
#include "common.h"

/* Bytes a rank gives each rank in the fixed-size collectives. */
#define BLOCK 5
/* Ranks this example takes at most (its buffers are on the stack). */
#define RANKS_MAX 16

/* Byte `i` of what rank `from` gives rank `to`. */
static uint8_t val(uint32_t from, uint32_t to, size_t i) {
    return (uint8_t)(from * 31 + to * 7 + i);
}

/* Bytes rank `from` gives rank `to` in the v-collectives: 1 to 4, different per pair. */
static size_t vcount(uint32_t from, uint32_t to) {
    return (from + 2 * to) % 4 + 1;
}

static void check(int ok, const char *what, uint32_t rank) {
    if (!ok) {
        fprintf(stderr, "rank %u: %s gave a wrong result\n", rank, what);
        exit(1);
    }
}

int main(void) {
    RwGroup *g;
    CHECK(rw_group_from_env(&g));
    uint32_t r, n;
    CHECK(rw_group_rank(g, &r));
    CHECK(rw_group_size(g, &n));
    if (n > RANKS_MAX) {
        fprintf(stderr, "this example takes at most %d ranks\n", RANKS_MAX);
        return 2;
    }
    uint32_t root = n - 1;
    int at_root = r == root;
    uint8_t send[RANKS_MAX * BLOCK], recv[RANKS_MAX * BLOCK];
    size_t counts[RANKS_MAX], rcounts[RANKS_MAX];
    CHECK(rw_group_barrier(g));

    /* bcast: the root's bytes everywhere. */
    uint8_t b[BLOCK];
    for (size_t i = 0; i < BLOCK; i++) b[i] = at_root ? val(root, 0, i) : 0;
    CHECK(rw_group_bcast(g, root, b, BLOCK));
    for (size_t i = 0; i < BLOCK; i++) check(b[i] == val(root, 0, i), "bcast", r);

    /* scatter: block j of the root's buffer to rank j. */
    for (uint32_t j = 0; j < n; j++)
        for (size_t i = 0; i < BLOCK; i++) send[j * BLOCK + i] = val(root, j, i);
    memset(recv, 0, sizeof recv);
    CHECK(rw_group_scatter(g, root, at_root ? send : NULL, BLOCK, recv));
    for (size_t i = 0; i < BLOCK; i++) check(recv[i] == val(root, r, i), "scatter", r);

    /* scatterv: vcount(root, j) bytes to rank j, packed by rank. */
    size_t at = 0;
    for (uint32_t j = 0; j < n; j++) {
        counts[j] = vcount(root, j);
        for (size_t i = 0; i < counts[j]; i++) send[at++] = val(root, j, i);
    }
    memset(recv, 0, sizeof recv);
    CHECK(rw_group_scatterv(g, root, at_root ? send : NULL, at_root ? counts : NULL, recv, vcount(root, r)));
    for (size_t i = 0; i < vcount(root, r); i++) check(recv[i] == val(root, r, i), "scatterv", r);

    /* gather: every rank's block, by rank, at the root. */
    for (size_t i = 0; i < BLOCK; i++) send[i] = val(r, root, i);
    memset(recv, 0, sizeof recv);
    CHECK(rw_group_gather(g, root, send, BLOCK, at_root ? recv : NULL));
    if (at_root)
        for (uint32_t j = 0; j < n; j++)
            for (size_t i = 0; i < BLOCK; i++) check(recv[j * BLOCK + i] == val(j, root, i), "gather", r);

    /* gatherv: vcount(j, root) bytes from rank j, packed by rank, at the root. */
    for (size_t i = 0; i < vcount(r, root); i++) send[i] = val(r, root, i);
    for (uint32_t j = 0; j < n; j++) counts[j] = vcount(j, root);
    memset(recv, 0, sizeof recv);
    CHECK(rw_group_gatherv(g, root, send, vcount(r, root), at_root ? counts : NULL, at_root ? recv : NULL));
    at = 0;
    if (at_root)
        for (uint32_t j = 0; j < n; j++)
            for (size_t i = 0; i < counts[j]; i++) check(recv[at++] == val(j, root, i), "gatherv", r);

    /* allgather: every rank's block, by rank, everywhere. */
    for (size_t i = 0; i < BLOCK; i++) send[i] = val(r, 0, i);
    memset(recv, 0, sizeof recv);
    CHECK(rw_group_allgather(g, send, BLOCK, recv));
    for (uint32_t j = 0; j < n; j++)
        for (size_t i = 0; i < BLOCK; i++) check(recv[j * BLOCK + i] == val(j, 0, i), "allgather", r);

    /* allgatherv: vcount(j, 0) bytes from rank j, packed by rank, everywhere. */
    for (size_t i = 0; i < vcount(r, 0); i++) send[i] = val(r, 0, i);
    for (uint32_t j = 0; j < n; j++) counts[j] = vcount(j, 0);
    memset(recv, 0, sizeof recv);
    CHECK(rw_group_allgatherv(g, send, vcount(r, 0), counts, recv));
    at = 0;
    for (uint32_t j = 0; j < n; j++)
        for (size_t i = 0; i < counts[j]; i++) check(recv[at++] == val(j, 0, i), "allgatherv", r);

    /* alltoall: block j to rank j, block j of the result from rank j. */
    for (uint32_t j = 0; j < n; j++)
        for (size_t i = 0; i < BLOCK; i++) send[j * BLOCK + i] = val(r, j, i);
    memset(recv, 0, sizeof recv);
    CHECK(rw_group_alltoall(g, send, BLOCK, recv));
    for (uint32_t j = 0; j < n; j++)
        for (size_t i = 0; i < BLOCK; i++) check(recv[j * BLOCK + i] == val(j, r, i), "alltoall", r);

    /* alltoallv: vcount(r, j) bytes to rank j, vcount(j, r) from it, packed by rank. */
    at = 0;
    for (uint32_t j = 0; j < n; j++) {
        counts[j] = vcount(r, j);
        rcounts[j] = vcount(j, r);
        for (size_t i = 0; i < counts[j]; i++) send[at++] = val(r, j, i);
    }
    memset(recv, 0, sizeof recv);
    CHECK(rw_group_alltoallv(g, send, counts, recv, rcounts));
    at = 0;
    for (uint32_t j = 0; j < n; j++)
        for (size_t i = 0; i < rcounts[j]; i++) check(recv[at++] == val(j, r, i), "alltoallv", r);

    /* Reductions, one of each type and operation: rank r gives r + 1 (and 2). */
    uint64_t su[2] = {r + 1, 2};
    CHECK(rw_group_reduce_u64(g, root, su, 2, RW_REDUCE_SUM));
    if (at_root) check(su[0] == (uint64_t)n * (n + 1) / 2 && su[1] == 2u * n, "reduce u64 sum", r);
    uint64_t au[2] = {r + 1, 2};
    CHECK(rw_group_allreduce_u64(g, au, 2, RW_REDUCE_SUM));
    check(au[0] == (uint64_t)n * (n + 1) / 2 && au[1] == 2u * n, "allreduce u64 sum", r);
    int64_t mi = (int64_t)r - 5;
    CHECK(rw_group_allreduce_i64(g, &mi, 1, RW_REDUCE_MIN));
    check(mi == -5, "allreduce i64 min", r);
    int64_t rmi = (int64_t)r - 5;
    CHECK(rw_group_reduce_i64(g, root, &rmi, 1, RW_REDUCE_MIN));
    if (at_root) check(rmi == -5, "reduce i64 min", r);
    uint32_t mx = r * 3;
    CHECK(rw_group_allreduce_u32(g, &mx, 1, RW_REDUCE_MAX));
    check(mx == (n - 1) * 3, "allreduce u32 max", r);
    uint32_t rmx = r * 3;
    CHECK(rw_group_reduce_u32(g, root, &rmx, 1, RW_REDUCE_MAX));
    if (at_root) check(rmx == (n - 1) * 3, "reduce u32 max", r);
    int32_t si = -(int32_t)r;
    CHECK(rw_group_allreduce_i32(g, &si, 1, RW_REDUCE_SUM));
    check(si == -(int32_t)(n * (n - 1) / 2), "allreduce i32 sum", r);
    int32_t rsi = -(int32_t)r;
    CHECK(rw_group_reduce_i32(g, root, &rsi, 1, RW_REDUCE_SUM));
    if (at_root) check(rsi == -(int32_t)(n * (n - 1) / 2), "reduce i32 sum", r);
    double pd = 2.0, expect_pd = 1.0;
    for (uint32_t j = 0; j < n; j++) expect_pd *= 2.0;
    CHECK(rw_group_allreduce_f64(g, &pd, 1, RW_REDUCE_PRODUCT));
    check(pd == expect_pd, "allreduce f64 product", r);
    double rpd = 2.0;
    CHECK(rw_group_reduce_f64(g, root, &rpd, 1, RW_REDUCE_PRODUCT));
    if (at_root) check(rpd == expect_pd, "reduce f64 product", r);
    float sf = 0.5f;
    CHECK(rw_group_allreduce_f32(g, &sf, 1, RW_REDUCE_SUM));
    check(sf == 0.5f * (float)n, "allreduce f32 sum", r);
    float rsf = 0.5f;
    CHECK(rw_group_reduce_f32(g, root, &rsf, 1, RW_REDUCE_SUM));
    if (at_root) check(rsf == 0.5f * (float)n, "reduce f32 sum", r);

    /* A root that is no rank is refused with its own code. */
    expect(rw_group_bcast(g, n, b, BLOCK), RW_STATUS_BAD_ARGUMENT, "bcast from a rank that does not exist");

    CHECK(rw_group_leave(g));
    printf("collectives ok %u\n", r);
    return 0;
}
