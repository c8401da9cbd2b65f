/*
 * Ping-pong between two processes over rackwire, from C: the client writes 8 bytes into the
 * server's region with a notification, the server answers the same way into the client's.
 *
 *   pingpong server ITERS [signal]   (publishes "c-pingpong/server")
 *   pingpong client ITERS [signal]   (publishes "c-pingpong/client"; prints the mean one-way
 *                                     latency)
 *
 * With `signal`, each side writes the 8 bytes and then a signal word (the round number) with
 * rw_write_signal, and the other waits for its word with rw_region_wait_u64 instead of a
 * notification (OpenSHMEM's put-with-signal and signal wait).
 *
 * Both need RACKWIRE_MH, RACKWIRE_SECRET (or _FILE) and a RACKWIRE_NAME of their own.
 */
#include "common.h"

static RwRemoteRegion lookup_retry(RwFabric *f, const char *name) {
    RwRemoteRegion h;
    for (int i = 0; i < 3000; i++) {
        if (rw_lookup(f, name, &h) == RW_STATUS_OK) return h;
        sleep_ms(10);
    }
    CHECK(rw_lookup(f, name, &h));
    return h;
}

int main(int argc, char **argv) {
    if (argc != 3 && !(argc == 4 && strcmp(argv[3], "signal") == 0)) {
        fprintf(stderr, "usage: %s server|client ITERS [signal]\n", argv[0]);
        return 2;
    }
    int server = strcmp(argv[1], "server") == 0;
    int signal = argc == 4;
    long iters = atol(argv[2]);
    RwFabric *f;
    CHECK(rw_fabric_join_env(&f));
    RwRegion *mine;
    CHECK(rw_region_alloc(f, 4096, RW_ACCESS_READ | RW_ACCESS_WRITE, &mine));
    CHECK(rw_region_publish(mine, server ? "c-pingpong/server" : "c-pingpong/client"));
    RwRemoteRegion peer = lookup_retry(f, server ? "c-pingpong/client" : "c-pingpong/server");
    uint32_t peer_node;
    CHECK(rw_remote_node(&peer, &peer_node));
    CHECK(rw_region_grant(mine, peer_node, RW_ACCESS_WRITE));
    RwConn *c;
    CHECK(rw_connect(f, peer_node, &c));
    uint8_t *mem;
    size_t len;
    CHECK(rw_region_ptr(mine, &mem, &len));

    /* Both sides are granted before the first ping. */
    say(c, "granted");
    expect_msg(f, "granted");

    RwOpFlags fl = {.notify = true, .imm = 0, .fence_before = false, .fence_after = false};
    double t0 = now_us();
    if (signal) {
        /* The data at offset 8, the signal word (round + 1) at offset 0. */
        RwOpFlags none = {0};
        for (long i = 0; i < iters; i++) {
            uint64_t v = (uint64_t)i, word, got;
            RwOp *op;
            if (!server) {
                CHECK(rw_write_signal(c, &peer, 8, (const uint8_t *)&v, 8, 0, v + 1, false, none, &op));
                CHECK(rw_op_wait(op));
                rw_op_free(op);
            }
            CHECK(rw_region_wait_u64(mine, 0, RW_CMP_GE, v + 1, 30000, &word));
            memcpy(&got, mem + 8, 8);
            if (word != v + 1 || got != v) {
                fprintf(stderr, "round %ld: signal %llu, found %llu\n", i, (unsigned long long)word,
                        (unsigned long long)got);
                return 1;
            }
            if (server) {
                CHECK(rw_write_signal(c, &peer, 8, (const uint8_t *)&v, 8, 0, v + 1, false, none, &op));
                CHECK(rw_op_wait(op));
                rw_op_free(op);
            }
        }
    }
    for (long i = 0; i < iters && !signal; i++) {
        uint64_t v = (uint64_t)i;
        if (!server) {
            fl.imm = v;
            CHECK(rw_write_wait(c, &peer, 0, (const uint8_t *)&v, 8, fl));
        }
        RwNotification n;
        CHECK(rw_fabric_wait_notification(f, 30000, &n));
        uint64_t got;
        memcpy(&got, mem, 8); /* zero-copy: the bytes landed in this process's memory */
        if (n.imm != v || got != v) {
            fprintf(stderr, "round %ld: notified %llu, found %llu\n", i, (unsigned long long)n.imm,
                    (unsigned long long)got);
            return 1;
        }
        if (server) {
            fl.imm = v;
            CHECK(rw_write_wait(c, &peer, 0, (const uint8_t *)&v, 8, fl));
        }
    }
    double t1 = now_us();
    if (!server)
        printf("pingpong %ld rounds%s, one-way latency %.3f us\n", iters, signal ? " with signals" : "",
               (t1 - t0) / iters / 2);
    say(c, "bye");
    expect_msg(f, "bye");
    rw_conn_free(c);
    rw_region_free(mine);
    rw_fabric_free(f);
    return 0;
}
