/*
 * What the C files of the rackwire provider share: libfabric's headers, the Rust side's
 * functions, the objects' layouts and the answers common to every table.
 */
#ifndef RW_PROVIDER_H
#define RW_PROVIDER_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <rdma/providers/fi_prov.h>
#include <pthread.h>
#include <time.h>

/* ---- the Rust side ---- */
int rwofi_configured(void);
void rwofi_forked(void);
int64_t rwofi_src_addr(void *out);
int64_t rwofi_domain_open(int auto_progress);
int64_t rwofi_wait_fd(void);
int64_t rwofi_trywait(const uint64_t *cqs, size_t count);
int64_t rwofi_domain_close(int auto_progress);
int64_t rwofi_cq_open(int format, uint64_t *out);
int64_t rwofi_cq_close(uint64_t cq);
int64_t rwofi_cq_read(uint64_t cq, void *buf, size_t count, fi_addr_t *src, int blocking, int timeout_ms);
struct rwofi_err {
	uintptr_t op_context;
	uint64_t flags;
	size_t len;
	uintptr_t buf;
	uint64_t data;
	uint64_t tag;
	size_t olen;
	int err;
	int prov_errno;
};
int64_t rwofi_cq_readerr(uint64_t cq, struct rwofi_err *out);
const char *rwofi_strerror(int prov_errno);
int64_t rwofi_cq_signal(uint64_t cq);
int64_t rwofi_cntr_open(uint64_t *out);
int64_t rwofi_cntr_close(uint64_t c);
uint64_t rwofi_cntr_read(uint64_t c, int errors);
int64_t rwofi_cntr_change(uint64_t c, int errors, int add, uint64_t v);
int64_t rwofi_cntr_wait(uint64_t c, uint64_t threshold, int timeout_ms);
int64_t rwofi_av_open(int kind, uint64_t *out);
int64_t rwofi_av_close(uint64_t av);
int64_t rwofi_av_insert(uint64_t av, const void *addr, size_t count, fi_addr_t *fi_addr);
int64_t rwofi_av_remove(uint64_t av, const fi_addr_t *fi_addr, size_t count);
int64_t rwofi_av_lookup(uint64_t av, fi_addr_t fa, void *addr, size_t *len);
int64_t rwofi_ep_open(uint64_t *out);
int64_t rwofi_ep_close(uint64_t ep);
int64_t rwofi_ep_bind(uint64_t ep, int kind, uint64_t obj, uint64_t flags);
int64_t rwofi_ep_enable(uint64_t ep);
int64_t rwofi_ep_getname(uint64_t ep, void *addr, size_t *len);
int64_t rwofi_ep_min_multi_recv(uint64_t ep, int set, size_t *value);
int64_t rwofi_ep_cancel(uint64_t ep, void *ctx);
int64_t rwofi_send(uint64_t ep, const struct iovec *iov, size_t count, fi_addr_t dest, int tagged, uint64_t tag,
		   int has_data, uint64_t data, uint64_t flags, void *ctx);
int64_t rwofi_mr_reg(const void *buf, size_t len, uint64_t access, uint64_t *key);
int64_t rwofi_mr_close(uint64_t key);
int64_t rwofi_rma(uint64_t ep, int read, const struct iovec *iov, size_t count, fi_addr_t peer, uint64_t addr,
		  uint64_t key, int has_data, uint64_t data, uint64_t flags, void *ctx);
int64_t rwofi_atomic(uint64_t ep, int form, int dt, int op, const void *buf, size_t count, const void *compare,
		     void *result, fi_addr_t peer, uint64_t addr, uint64_t key, uint64_t flags, void *ctx);
int64_t rwofi_atomic_valid(int dt, int op, int form, size_t *count);
int64_t rwofi_recv(uint64_t ep, const struct iovec *iov, size_t count, fi_addr_t src, int tagged, uint64_t tag,
		   uint64_t ignore, uint64_t flags, void *ctx);

/* The values the Rust side uses (src/consts.rs), checked against these headers. */
_Static_assert(FI_MSG == (1ULL << 1) && FI_TAGGED == (1ULL << 3), "caps");
_Static_assert(FI_RECV == (1ULL << 10) && FI_SEND == (1ULL << 11), "caps");
_Static_assert(FI_MULTI_RECV == (1ULL << 16) && FI_REMOTE_CQ_DATA == (1ULL << 17) && FI_PEEK == (1ULL << 19), "flags");
_Static_assert(FI_COMPLETION == (1ULL << 24) && FI_INJECT == (1ULL << 25), "flags");
_Static_assert(FI_CLAIM == (1ULL << 59) && FI_DISCARD == (1ULL << 58), "flags");
_Static_assert(FI_SELECTIVE_COMPLETION == (1ULL << 59) && FI_TRANSMIT == FI_SEND, "bind flags");
_Static_assert(FI_ADDR_UNSPEC == UINT64_MAX && FI_ADDR_NOTAVAIL == UINT64_MAX, "addresses");
_Static_assert(FI_ENOENT == 2 && FI_EIO == 5 && FI_EAGAIN == 11 && FI_ENOMEM == 12 && FI_EACCES == 13, "errors");
_Static_assert(FI_EBUSY == 16 && FI_ENODEV == 19 && FI_EINVAL == 22 && FI_ENOSYS == 38, "errors");
_Static_assert(FI_ENOMSG == 42 && FI_ENODATA == 61 && FI_EMSGSIZE == 90 && FI_EADDRNOTAVAIL == 99, "errors");
_Static_assert(FI_ETIMEDOUT == 110 && FI_EHOSTUNREACH == 113 && FI_ECANCELED == 125, "errors");
_Static_assert(FI_EOTHER == 256 && FI_ETOOSMALL == 257 && FI_EOPBADSTATE == 258 && FI_EAVAIL == 259, "errors");
_Static_assert(FI_ENOCQ == 263 && FI_ENOAV == 267 && FI_ETRUNC == 265, "errors");
_Static_assert(FI_CQ_FORMAT_CONTEXT == 1 && FI_CQ_FORMAT_TAGGED == 4, "formats");
_Static_assert(FI_AV_MAP == 1 && FI_AV_TABLE == 2, "av types");
_Static_assert(sizeof(struct fi_cq_tagged_entry) == 48, "tagged entry");
_Static_assert(FI_RMA == (1ULL << 2) && FI_ATOMIC == (1ULL << 4) && FI_READ == (1ULL << 8) && FI_WRITE == (1ULL << 9),
	       "rma caps");
_Static_assert(FI_REMOTE_READ == (1ULL << 12) && FI_REMOTE_WRITE == (1ULL << 13), "rma caps");
_Static_assert(FI_EKEYREJECTED == 129 && FI_EOPNOTSUPP == 95, "errors");
_Static_assert(FI_INT8 == 0 && FI_UINT64 == 7 && FI_FLOAT == 8 && FI_DOUBLE == 9, "datatypes");
_Static_assert(FI_MIN == 0 && FI_BXOR == 9 && FI_ATOMIC_READ == 10 && FI_ATOMIC_WRITE == 11, "atomic ops");
_Static_assert(FI_CSWAP == 12 && FI_CSWAP_GT == 17 && FI_MSWAP == 18, "atomic ops");

/* What the provider offers (src/engine.rs, src/ep.rs, src/wire.rs have the numbers). */
#define RW_PROV_NAME "rackwire"
#define RW_PROV_VERSION FI_VERSION(0, 1)
#define RW_FI_VERSION FI_VERSION(1, 17)
#define RW_PRIMARY_CAPS (FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_SEND | FI_RECV | FI_READ | FI_WRITE | \
			 FI_REMOTE_READ | FI_REMOTE_WRITE)
#define RW_SECONDARY_CAPS (FI_SOURCE | FI_DIRECTED_RECV | FI_MULTI_RECV | FI_LOCAL_COMM | FI_REMOTE_COMM)
/* What comes with whatever was asked for: the modifiers and the secondary capabilities. */
#define RW_OPTIONAL_CAPS (FI_SEND | FI_RECV | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SOURCE | \
			  FI_MULTI_RECV | \
			  FI_LOCAL_COMM | FI_REMOTE_COMM)
/* Which capabilities belong to the transmit side, which to the receive side. */
#define RW_TX_CAPS (FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_SEND | FI_READ | FI_WRITE)
#define RW_RX_CAPS (FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE | \
		    FI_DIRECTED_RECV | FI_SOURCE | FI_MULTI_RECV)
/* RMA addresses are virtual addresses, keys the provider's: an application must allow both. */
#define RW_RMA_MR_MODE (FI_MR_VIRT_ADDR | FI_MR_PROV_KEY)
#define RW_ORDER (FI_ORDER_SAS | FI_ORDER_RAR | FI_ORDER_RAW | FI_ORDER_RAS | FI_ORDER_WAR | FI_ORDER_WAW | \
		  FI_ORDER_WAS | FI_ORDER_SAR | FI_ORDER_SAW)
#define RW_CAPS (RW_PRIMARY_CAPS | RW_SECONDARY_CAPS)
#define RW_ADDR_BYTES 8
#define RW_MSG_BYTES_MAX ((size_t)1 << 30)
#define RW_INJECT_BYTES (65536 - 48)
#define RW_TX_SIZE 1024
#define RW_RX_SIZE 4096
#define RW_IOV_LIMIT 16
#define RW_BUFFERED_RECV ((size_t)64 << 20)
#define RW_OBJECTS_MAX 1024
#define RW_TRYWAIT_MAX 64 /* queues one fi_trywait looks at, at most */

/* ---- objects ---- */
struct rw_fabric {
	struct fid_fabric f;
};
struct rw_domain {
	struct fid_domain d;
	uint64_t next_key;
	int auto_progress; /* opened with FI_PROGRESS_AUTO */
};
struct rw_ep {
	struct fid_ep ep;
	uint64_t h;
	uint64_t tx_flags, rx_flags; /* default op flags, from tx_attr and rx_attr */
	int directed;                /* FI_DIRECTED_RECV: receives heed their source address */
};
struct rw_cq {
	struct fid_cq cq;
	uint64_t h;
	int wait_fd; /* opened with FI_WAIT_FD: fi_control(FI_GETWAIT) gives the fabric's input descriptor */
};
struct rw_av {
	struct fid_av av;
	uint64_t h;
};
struct rw_cntr {
	struct fid_cntr c;
	uint64_t h;
};
struct rw_eq {
	struct fid_eq eq;
};
struct rw_mr {
	struct fid_mr mr;
};

/* The provider's own operation flag, in a bit libfabric 1.17 leaves unused: the call is an
 * inject (fi_inject and friends), which writes no completion. Cleared from the flags an
 * application passes. */
#define RW_NO_COMPLETION (1ULL << 62)

/* An atomic call's form, as the Rust side numbers it. */
enum rw_atomic_form { RW_ATOMIC_WRITE = 0, RW_ATOMIC_FETCH = 1, RW_ATOMIC_COMPARE = 2 };

#define OF(type, field, p) ((type *)((char *)(p) - offsetof(type, field)))

static inline int ret_int(int64_t r) { return r < 0 ? (int)r : 0; }

/* ---- operations nobody offers here: typed, so every table entry is a real function ---- */

#define FID_OPS(close_fn, bind_fn, control_fn) \
	{ .size = sizeof(struct fi_ops), .close = close_fn, .bind = bind_fn, .control = control_fn, \
	  .ops_open = rw_no_ops_open, .tostr = rw_no_tostr, .ops_set = rw_no_ops_set }


/* What every object answers for what it does not do. */
static inline int rw_no_bind(struct fid *fid, struct fid *bfid, uint64_t flags) { (void)fid; (void)bfid; (void)flags; return -FI_ENOSYS; }
static inline int rw_no_control(struct fid *fid, int command, void *arg) { (void)fid; (void)command; (void)arg; return -FI_ENOSYS; }
static inline int rw_no_ops_open(struct fid *fid, const char *name, uint64_t flags, void **ops, void *context)
{
	(void)fid; (void)name; (void)flags; (void)ops; (void)context;
	return -FI_ENOSYS;
}
static inline int rw_no_tostr(const struct fid *fid, char *buf, size_t len) { (void)fid; (void)buf; (void)len; return -FI_ENOSYS; }
static inline int rw_no_ops_set(struct fid *fid, const char *name, uint64_t flags, void *ops, void *context)
{
	(void)fid; (void)name; (void)flags; (void)ops; (void)context;
	return -FI_ENOSYS;
}

int rw_ep_open(struct fid_domain *d, struct fi_info *info, struct fid_ep **out, void *context);
int rw_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
	       const struct fi_info *hints, struct fi_info **info);

#endif
