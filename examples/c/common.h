/* Helpers shared by the C examples: fail loudly on any unexpected status. */
#ifndef RW_EXAMPLE_COMMON_H
#define RW_EXAMPLE_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rackwire.h"

/* Stop the program unless `st` is `want`, saying which call and why. */
static inline void expect(RwStatus st, RwStatus want, const char *what) {
    if (st != want) {
        fprintf(stderr, "%s: got %s (%s), expected %s\n", what, rw_status_name(st), rackwire_last_error(),
                rw_status_name(want));
        exit(1);
    }
}

#define CHECK(call) expect((call), RW_STATUS_OK, #call)

static inline double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static inline void sleep_ms(long ms) {
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* The next message from any peer, which must be `want`; returns its sender. */
static inline uint32_t expect_msg(RwFabric *f, const char *want) {
    char buf[256];
    size_t len = 0;
    uint32_t from = 0;
    CHECK(rw_fabric_recv(f, 30000, (uint8_t *)buf, sizeof buf - 1, &len, &from));
    buf[len] = 0;
    if (strcmp(buf, want) != 0) {
        fprintf(stderr, "expected message \"%s\", got \"%s\"\n", want, buf);
        exit(1);
    }
    return from;
}

static inline void say(RwConn *c, const char *text) {
    CHECK(rw_send(c, (const uint8_t *)text, strlen(text)));
}

#endif
