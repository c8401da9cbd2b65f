/*
 * One-sided writes with a notification, and what the owner's grant decides, from C.
 *
 *   notify owner     allocates a region and publishes it as "c-notify"
 *   notify writer    writes into it: refused before the grant, refused with a forged key,
 *                    placed (and the owner notified) after the grant, refused once revoked;
 *                    then a datagram (and one too large, refused). On a served region
 *                    ("c-notify-served") granted write only, its write lands and its read
 *                    is refused, over shared memory too
 *
 * The owner checks, in its own memory, that only the granted write landed.
 */
#include "common.h"

static const char GREETING[] = "hello from C";

static int all_zero(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

static RwStatus write_wait(RwConn *c, const RwRemoteRegion *t, uint64_t off, const char *s, RwOpFlags fl) {
    RwOp *op;
    RwStatus st = rw_write(c, t, off, (const uint8_t *)s, strlen(s), fl, &op);
    if (st != RW_STATUS_OK) return st;
    st = rw_op_wait(op);
    rw_op_free(op);
    return st;
}

static int owner(RwFabric *f) {
    RwRegion *r;
    CHECK(rw_region_alloc(f, 4096, RW_ACCESS_READ | RW_ACCESS_WRITE, &r));
    uint8_t *mem;
    size_t len;
    CHECK(rw_region_ptr(r, &mem, &len));
    CHECK(rw_region_publish(r, "c-notify"));
    uint32_t writer = expect_msg(f, "hello");
    RwConn *c;
    CHECK(rw_connect(f, writer, &c));
    say(c, "try");
    expect_msg(f, "tried");
    if (!all_zero(mem, len)) {
        fprintf(stderr, "owner: a refused write changed the region\n");
        return 1;
    }
    CHECK(rw_region_grant(r, writer, RW_ACCESS_WRITE));
    RwRegion *served;
    CHECK(rw_region_alloc_served(f, 4096, RW_ACCESS_READ | RW_ACCESS_WRITE, &served));
    CHECK(rw_region_grant(served, writer, RW_ACCESS_WRITE));
    CHECK(rw_region_publish(served, "c-notify-served"));
    say(c, "go");
    RwNotification n;
    CHECK(rw_fabric_wait_notification(f, 30000, &n));
    if (n.imm != 42 || n.from != writer || n.offset != 64 || memcmp(mem + 64, GREETING, strlen(GREETING)) != 0) {
        fprintf(stderr, "owner: notification imm %llu from %u at %llu, or the bytes, are wrong\n",
                (unsigned long long)n.imm, n.from, (unsigned long long)n.offset);
        return 1;
    }
    CHECK(rw_region_revoke(r, writer));
    say(c, "revoked");
    expect_msg(f, "dgram");
    expect_msg(f, "done");
    if (!all_zero(mem + 128, len - 128)) {
        fprintf(stderr, "owner: a write after the revoke landed\n");
        return 1;
    }
    uint8_t *smem;
    size_t slen;
    CHECK(rw_region_ptr(served, &smem, &slen));
    if (memcmp(smem, "served", 6) != 0) {
        fprintf(stderr, "owner: the write into the served region did not land\n");
        return 1;
    }
    rw_region_free(served);
    printf("owner ok: notified with %llu, \"%s\" in place, every refused write left the region unchanged\n",
           (unsigned long long)n.imm, GREETING);
    rw_conn_free(c);
    rw_region_free(r);
    return 0;
}

static int writer(RwFabric *f) {
    RwRemoteRegion t;
    RwStatus st = RW_STATUS_UNKNOWN_REGION;
    for (int i = 0; i < 3000 && st != RW_STATUS_OK; i++) {
        st = rw_lookup(f, "c-notify", &t);
        if (st != RW_STATUS_OK) sleep_ms(10);
    }
    CHECK(st);
    char text[RW_REMOTE_REGION_TEXT_MAX];
    CHECK(rw_remote_to_text(&t, text, sizeof text));
    RwRemoteRegion again;
    CHECK(rw_remote_from_text(text, &again));
    if (memcmp(&again, &t, sizeof t) != 0) {
        fprintf(stderr, "writer: the handle did not survive its text form (%s)\n", text);
        return 1;
    }
    uint32_t node;
    CHECK(rw_remote_node(&t, &node));
    RwConn *c;
    CHECK(rw_connect(f, node, &c));
    say(c, "hello");
    expect_msg(f, "try");
    RwOpFlags none = {0};
    expect(write_wait(c, &t, 0, "not granted yet", none), RW_STATUS_UNGRANTED, "write before the grant");
    RwRemoteRegion forged = t;
    forged.bytes[RW_REMOTE_REGION_BYTES - 1] ^= 0x5a; /* the key's last byte */
    expect(write_wait(c, &forged, 0, "forged", none), RW_STATUS_BAD_KEY, "write with a forged key");
    say(c, "tried");
    expect_msg(f, "go");
    RwOpFlags notify = {.notify = true, .imm = 42};
    CHECK(write_wait(c, &t, 64, GREETING, notify));
    RwRemoteRegion s;
    CHECK(rw_lookup(f, "c-notify-served", &s));
    CHECK(write_wait(c, &s, 0, "served", none));
    RwOp *rd;
    CHECK(rw_read(c, &s, 0, 6, none, &rd));
    expect(rw_op_wait(rd), RW_STATUS_UNGRANTED, "a read of a served region granted write only");
    rw_op_free(rd);
    expect_msg(f, "revoked");
    expect(write_wait(c, &t, 128, "after the revoke", none), RW_STATUS_REVOKED, "write after the revoke");
    /* A datagram: a message with nothing to wait for; one past the largest is refused. */
    static uint8_t big[64 * 1024 + 1];
    expect(rw_send_datagram(c, big, sizeof big), RW_STATUS_MESSAGE_TOO_LARGE, "a datagram too large");
    CHECK(rw_send_datagram(c, (const uint8_t *)"dgram", 5));
    say(c, "done");
    printf("writer ok: ungranted, forged and revoked writes refused with their own codes; a served region's "
           "write grant does not read\n");
    rw_conn_free(c);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "owner") != 0 && strcmp(argv[1], "writer") != 0)) {
        fprintf(stderr, "usage: %s owner|writer\n", argv[0]);
        return 2;
    }
    RwFabric *f;
    CHECK(rw_fabric_join_env(&f));
    int rc = strcmp(argv[1], "owner") == 0 ? owner(f) : writer(f);
    rw_fabric_free(f);
    return rc;
}
