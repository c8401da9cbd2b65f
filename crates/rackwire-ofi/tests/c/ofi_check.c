/*
 * The rackwire provider through libfabric's own API, as an application uses it: two
 * processes (forked; names exchanged over a socket pair) on RDM endpoints. Checks, each with
 * the result it must give: fi_getinfo refusing hints it cannot meet; plain and tagged
 * messages, with remote CQ data and the sender's address (FI_SOURCE); a message sent before
 * its receive was posted; messages of several pieces (3 MiB) both ways round; truncation
 * as an error completion (FI_ETRUNC, its text); FI_PEEK, FI_CLAIM; cancel; tags with ignore
 * bits; inject (no completion); counters; RMA writes (3 MiB, and with remote CQ data) and
 * reads checked byte for byte; atomics (fetch-and-add, compare-and-swap, read) and what
 * fi_atomicvalid says; RMA served by automatic progress (FI_PROGRESS_AUTO) at a target making no
 * calls; a receiver sleeping on its queue's descriptor (FI_WAIT_FD, fi_trywait) woken by a message;
 * a stranger (a node outside the receiver's vectors) whose write is refused and whose message
 * is held until the receiver inserts it; a buffer of many messages (FI_MULTI_RECV); refused accesses (bad key, out of bounds, a read-only region, an
 * endpoint whose vector lacks the initiator) as error completions; bad use refused with
 * libfabric's codes; and a peer that left failing a send with an error completion. Prints
 * "<role> ok" and exits 0 when every check held; otherwise says which failed and exits 1.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#define V FI_VERSION(1, 17)
#define BIG ((size_t)3 << 20)
static const char *role = "main";

#define CHECK(cond, ...)                                                     \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "%s: check failed at line %d: ", role, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                        \
			fprintf(stderr, "\n");                               \
			exit(1);                                             \
		}                                                            \
	} while (0)
#define OK(call)                                                             \
	do {                                                                 \
		long _r = (long)(call);                                      \
		CHECK(_r == 0, "%s returned %ld (%s)", #call, _r, fi_strerror((int)-_r)); \
	} while (0)

struct side {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_cntr *tx_cntr, *rx_cntr;
	fi_addr_t peer;
	int sock;
};

static struct fi_info *hints_base(void)
{
	struct fi_info *h = fi_allocinfo();
	h->fabric_attr->prov_name = strdup("rackwire");
	h->ep_attr->type = FI_EP_RDM;
	h->caps = FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC | FI_SOURCE | FI_DIRECTED_RECV | FI_MULTI_RECV;
	h->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
	return h;
}

/* Hints the provider cannot meet get -FI_ENODATA; hints it can get its real limits. */
static void check_getinfo(void)
{
	struct fi_info *h, *fi = NULL;
	h = hints_base();
	h->domain_attr->mr_mode = FI_MR_LOCAL;
	CHECK(fi_getinfo(V, NULL, NULL, 0, h, &fi) == -FI_ENODATA, "RMA was offered without provider keys");
	fi_freeinfo(h);
	h = hints_base();
	h->ep_attr->type = FI_EP_MSG;
	CHECK(fi_getinfo(V, NULL, NULL, 0, h, &fi) == -FI_ENODATA, "FI_EP_MSG was offered");
	fi_freeinfo(h);
	h = hints_base();
	h->domain_attr->data_progress = FI_PROGRESS_AUTO;
	OK(fi_getinfo(V, NULL, NULL, 0, h, &fi));
	CHECK(fi->domain_attr->data_progress == FI_PROGRESS_AUTO, "automatic progress asked for, %d given",
	      fi->domain_attr->data_progress);
	fi_freeinfo(fi);
	fi_freeinfo(h);
	h = hints_base();
	h->tx_attr->inject_size = 1 << 20;
	CHECK(fi_getinfo(V, NULL, NULL, 0, h, &fi) == -FI_ENODATA, "a 1 MiB inject size was offered");
	fi_freeinfo(h);
	h = hints_base();
	OK(fi_getinfo(V, NULL, NULL, 0, h, &fi));
	CHECK(fi->ep_attr->type == FI_EP_RDM && (fi->caps & FI_TAGGED) && (fi->caps & FI_RMA), "caps %llx",
	      (unsigned long long)fi->caps);
	CHECK(fi->domain_attr->mr_mode == (FI_MR_VIRT_ADDR | FI_MR_PROV_KEY), "mr_mode %x", fi->domain_attr->mr_mode);
	CHECK(fi->ep_attr->max_msg_size == (size_t)1 << 30, "max_msg_size %zu", fi->ep_attr->max_msg_size);
	CHECK(fi->tx_attr->inject_size == 65536 - 48, "inject_size %zu", fi->tx_attr->inject_size);
	CHECK(!strcmp(fi->fabric_attr->prov_name, "rackwire"), "provider %s", fi->fabric_attr->prov_name);
	fi_freeinfo(fi);
	fi_freeinfo(h);
}

static void open_side(struct side *s, enum fi_av_type av_type)
{
	struct fi_info *h = hints_base();
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE };
	struct fi_av_attr av_attr = { .type = av_type };
	struct fi_cntr_attr cntr_attr = { .events = FI_CNTR_EVENTS_COMP };
	OK(fi_getinfo(V, NULL, NULL, 0, h, &s->info));
	fi_freeinfo(h);
	OK(fi_fabric(s->info->fabric_attr, &s->fabric, NULL));
	OK(fi_domain(s->fabric, s->info, &s->domain, NULL));
	OK(fi_endpoint(s->domain, s->info, &s->ep, NULL));
	OK(fi_cq_open(s->domain, &cq_attr, &s->cq, NULL));
	OK(fi_av_open(s->domain, &av_attr, &s->av, NULL));
	OK(fi_cntr_open(s->domain, &cntr_attr, &s->tx_cntr, NULL));
	OK(fi_cntr_open(s->domain, &cntr_attr, &s->rx_cntr, NULL));
	CHECK(fi_enable(s->ep) == -FI_ENOAV, "an endpoint without a vector was enabled");
	OK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
	OK(fi_ep_bind(s->ep, &s->av->fid, 0));
	OK(fi_ep_bind(s->ep, &s->tx_cntr->fid, FI_SEND));
	OK(fi_ep_bind(s->ep, &s->rx_cntr->fid, FI_RECV));
	OK(fi_enable(s->ep));
}

static void exchange_names(struct side *s)
{
	char mine[64], theirs[64];
	size_t len = sizeof(mine), tiny = 2;
	CHECK(fi_getname(&s->ep->fid, mine, &tiny) == -FI_ETOOSMALL && tiny == 8, "a short name buffer: len %zu", tiny);
	OK(fi_getname(&s->ep->fid, mine, &len));
	CHECK(len == 8, "name length %zu", len);
	CHECK(write(s->sock, mine, len) == (ssize_t)len, "writing the name");
	CHECK(read(s->sock, theirs, len) == (ssize_t)len, "reading the peer's name");
	CHECK(fi_av_insert(s->av, theirs, 1, &s->peer, 0, NULL) == 1, "inserting the peer's name");
	char back[16];
	size_t blen = sizeof(back);
	OK(fi_av_lookup(s->av, s->peer, back, &blen));
	CHECK(blen == 8 && !memcmp(back, theirs, 8), "the vector gives another address back");
}

static void sync_step(struct side *s)
{
	char c = 's';
	CHECK(write(s->sock, &c, 1) == 1 && read(s->sock, &c, 1) == 1, "syncing with the peer");
}

/* The next completion, waiting up to 10 s; its return is fi_cq_readfrom's. */
static ssize_t next(struct side *s, struct fi_cq_tagged_entry *e, fi_addr_t *src)
{
	for (int i = 0; i < 1000000; i++) {
		ssize_t r = fi_cq_readfrom(s->cq, e, 1, src);
		if (r != -FI_EAGAIN)
			return r;
		if (i > 1000)
			usleep(10);
	}
	return -FI_ETIMEDOUT;
}

static struct fi_cq_tagged_entry expect_one(struct side *s, uint64_t flags, fi_addr_t *src)
{
	struct fi_cq_tagged_entry e;
	fi_addr_t from = FI_ADDR_NOTAVAIL;
	ssize_t r = next(s, &e, &from);
	if (r == -FI_EAVAIL) {
		struct fi_cq_err_entry err = { 0 };
		fi_cq_readerr(s->cq, &err, 0);
		CHECK(0, "an error completion: %s (%s), flags %llx", fi_strerror(err.err),
		      fi_cq_strerror(s->cq, err.prov_errno, err.err_data, NULL, 0), (unsigned long long)err.flags);
	}
	CHECK(r == 1, "reading a completion: %zd (%s)", r, fi_strerror((int)-r));
	CHECK((e.flags & flags) == flags, "completion flags %llx lack %llx", (unsigned long long)e.flags,
	      (unsigned long long)flags);
	if (src)
		*src = from;
	return e;
}

static void fill(char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (char)((i * 31 + seed) & 0xff);
}
static int filled(const char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (char)((i * 31 + seed) & 0xff))
			return 0;
	return 1;
}

/* What the target tells the initiator: its region, a read-only region, and the name of a
 * second endpoint whose vector does not hold the initiator. */
struct rma_info {
	uint64_t addr, key, ro_addr, ro_key;
	char ep2[8];
};

/* Wait for the answer to an RMA operation: its completion, or its error (returned). */
static int rma_done(struct side *s, uint64_t flags)
{
	struct fi_cq_tagged_entry e;
	ssize_t r = next(s, &e, NULL);
	if (r == -FI_EAVAIL) {
		struct fi_cq_err_entry err = { 0 };
		CHECK(fi_cq_readerr(s->cq, &err, 0) == 1, "reading an RMA error");
		return err.err;
	}
	CHECK(r == 1 && (e.flags & flags) == flags, "RMA completion: %zd, flags %llx", r, (unsigned long long)e.flags);
	return 0;
}

static void rma_initiator(struct side *s, char *big)
{
	struct rma_info info;
	char ctx[16];
	fi_addr_t ep2;
	CHECK(read(s->sock, &info, sizeof info) == (ssize_t)sizeof info, "reading the target's regions");
	CHECK(fi_av_insert(s->av, info.ep2, 1, &ep2, 0, NULL) == 1, "inserting the second endpoint");
	/* 3 MiB written in pieces, read back. */
	fill(big, BIG, 3);
	OK(fi_write(s->ep, big, BIG, NULL, s->peer, info.addr, info.key, ctx));
	CHECK(rma_done(s, FI_RMA | FI_WRITE) == 0, "the 3 MiB write failed");
	char *back = calloc(1, BIG);
	OK(fi_read(s->ep, back, BIG, NULL, s->peer, info.addr, info.key, ctx));
	CHECK(rma_done(s, FI_RMA | FI_READ) == 0, "the 3 MiB read failed");
	CHECK(filled(back, BIG, 3), "the 3 MiB read back differs");
	free(back);
	/* A write with remote CQ data (the target checks it got 99), and atomics on the words past it. */
	uint64_t word = 5, old = 0, cmp = 0, res = 0;
	OK(fi_writedata(s->ep, &word, 8, NULL, 99, s->peer, info.addr + BIG + 8, info.key, ctx));
	CHECK(rma_done(s, FI_RMA | FI_WRITE) == 0, "the write with data failed");
	word = 10;
	OK(fi_fetch_atomic(s->ep, &word, 1, NULL, &old, NULL, s->peer, info.addr + BIG + 8, info.key, FI_UINT64, FI_SUM, ctx));
	CHECK(rma_done(s, FI_ATOMIC | FI_READ) == 0 && old == 5, "fetch-and-add: old %llu", (unsigned long long)old);
	word = 77;
	cmp = 14;
	OK(fi_compare_atomic(s->ep, &word, 1, NULL, &cmp, NULL, &res, NULL, s->peer, info.addr + BIG + 8, info.key, FI_UINT64,
			     FI_CSWAP, ctx));
	CHECK(rma_done(s, FI_ATOMIC) == 0 && res == 15, "compare-and-swap that must fail: old %llu", (unsigned long long)res);
	cmp = 15;
	OK(fi_compare_atomic(s->ep, &word, 1, NULL, &cmp, NULL, &res, NULL, s->peer, info.addr + BIG + 8, info.key, FI_UINT64,
			     FI_CSWAP, ctx));
	CHECK(rma_done(s, FI_ATOMIC) == 0 && res == 15, "compare-and-swap: old %llu", (unsigned long long)res);
	OK(fi_fetch_atomic(s->ep, NULL, 1, NULL, &res, NULL, s->peer, info.addr + BIG + 8, info.key, FI_UINT64, FI_ATOMIC_READ,
			   ctx));
	CHECK(rma_done(s, FI_ATOMIC) == 0 && res == 77, "atomic read: %llu", (unsigned long long)res);
	word = 1;
	OK(fi_atomic(s->ep, &word, 1, NULL, s->peer, info.addr + BIG + 16, info.key, FI_UINT64, FI_SUM, ctx));
	CHECK(rma_done(s, FI_ATOMIC | FI_WRITE) == 0, "atomic add failed");
	/* Refused at the target: each an error completion with its own code. */
	OK(fi_write(s->ep, big, 8, NULL, s->peer, info.addr, info.key ^ 1, ctx));
	CHECK(rma_done(s, 0) == FI_EKEYREJECTED, "a write with a bad key");
	OK(fi_write(s->ep, big, 64, NULL, s->peer, info.addr + BIG + 32, info.key, ctx));
	CHECK(rma_done(s, 0) == FI_EACCES, "a write past the region's end");
	OK(fi_write(s->ep, big, 8, NULL, s->peer, info.ro_addr, info.ro_key, ctx));
	CHECK(rma_done(s, 0) == FI_EACCES, "a write into a read-only region");
	OK(fi_read(s->ep, big, 8, NULL, ep2, info.addr, info.key, ctx));
	CHECK(rma_done(s, 0) == FI_EACCES, "a read through an endpoint whose vector lacks the initiator");
	OK(fi_read(s->ep, big, 8, NULL, s->peer, info.ro_addr, info.ro_key, ctx));
	CHECK(rma_done(s, FI_RMA | FI_READ) == 0 && !memcmp(big, "readonly", 8), "reading the read-only region");
	CHECK(write(s->sock, "d", 1) == 1, "telling the target the RMA is done");
	sync_step(s);
}

/* Serve RMA (the provider's progress runs in every read of the queue) until the initiator is
 * done; then check the memory. */
static void rma_target(struct side *s)
{
	char *mem = calloc(1, BIG + 64);
	char ro[64] = "readonly";
	struct fid_mr *mr, *ro_mr;
	struct fid_ep *ep2;
	struct fid_av *av2;
	struct fid_cq *cq2;
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE };
	struct rma_info info = { 0 };
	size_t len = 8;
	OK(fi_mr_reg(s->domain, mem, BIG + 64, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL));
	OK(fi_mr_reg(s->domain, ro, sizeof ro, FI_REMOTE_READ, 0, 0, 0, &ro_mr, NULL));
	OK(fi_endpoint(s->domain, s->info, &ep2, NULL));
	OK(fi_av_open(s->domain, &av_attr, &av2, NULL));
	OK(fi_cq_open(s->domain, &cq_attr, &cq2, NULL));
	OK(fi_ep_bind(ep2, &cq2->fid, FI_TRANSMIT | FI_RECV));
	OK(fi_ep_bind(ep2, &av2->fid, 0));
	OK(fi_enable(ep2));
	OK(fi_getname(&ep2->fid, info.ep2, &len));
	info.addr = (uint64_t)(uintptr_t)mem;
	info.key = fi_mr_key(mr);
	info.ro_addr = (uint64_t)(uintptr_t)ro;
	info.ro_key = fi_mr_key(ro_mr);
	CHECK(info.key != info.ro_key && info.key != 0, "keys %llx %llx", (unsigned long long)info.key,
	      (unsigned long long)info.ro_key);
	CHECK(write(s->sock, &info, sizeof info) == (ssize_t)sizeof info, "sending the regions");
	int data_seen = 0;
	for (;;) {
		struct fi_cq_tagged_entry e;
		fi_addr_t from;
		ssize_t r = fi_cq_readfrom(s->cq, &e, 1, &from);
		if (r == 1) {
			CHECK((e.flags & FI_REMOTE_CQ_DATA) && (e.flags & FI_REMOTE_WRITE) && e.data == 99 && from == s->peer,
			      "remote CQ data: flags %llx data %llu", (unsigned long long)e.flags, (unsigned long long)e.data);
			data_seen++;
		}
		char c;
		if (recv(s->sock, &c, 1, MSG_DONTWAIT) == 1)
			break;
	}
	CHECK(data_seen == 1, "remote CQ data completions: %d", data_seen);
	CHECK(filled(mem, BIG, 3) && *(uint64_t *)(mem + BIG + 8) == 77 && *(uint64_t *)(mem + BIG + 16) == 1,
	      "the target's memory after the RMA");
	sync_step(s);
	OK(fi_close(&ep2->fid));
	OK(fi_close(&cq2->fid));
	OK(fi_close(&av2->fid));
	OK(fi_close(&mr->fid));
	OK(fi_close(&ro_mr->fid));
	free(mem);
}

/* Automatic progress: the target opens a second domain with FI_PROGRESS_AUTO, registers
 * memory there and then makes no libfabric call at all (it waits on the socket) while the
 * initiator writes 64 bytes into it and reads them back: only the provider's own thread can
 * serve them, and both must complete with the bytes intact. */
struct auto_info {
	uint64_t addr, key;
	char name[8];
};

static void auto_target(struct side *s)
{
	struct fi_info *h = hints_base(), *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_ep *ep;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_mr *mr;
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_NONE };
	struct auto_info ai = { 0 };
	char peer[8];
	size_t len = sizeof peer;
	fi_addr_t pa;
	h->domain_attr->data_progress = FI_PROGRESS_AUTO;
	OK(fi_getinfo(V, NULL, NULL, 0, h, &info));
	fi_freeinfo(h);
	OK(fi_fabric(info->fabric_attr, &fabric, NULL));
	OK(fi_domain(fabric, info, &domain, NULL));
	OK(fi_endpoint(domain, info, &ep, NULL));
	OK(fi_av_open(domain, &av_attr, &av, NULL));
	OK(fi_cq_open(domain, &cq_attr, &cq, NULL));
	OK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	OK(fi_ep_bind(ep, &av->fid, 0));
	OK(fi_enable(ep));
	OK(fi_av_lookup(s->av, s->peer, peer, &len));
	CHECK(fi_av_insert(av, peer, 1, &pa, 0, NULL) == 1, "inserting the initiator");
	char *mem = calloc(1, 4096);
	OK(fi_mr_reg(domain, mem, 4096, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL));
	ai.addr = (uint64_t)(uintptr_t)mem;
	ai.key = fi_mr_key(mr);
	len = sizeof ai.name;
	OK(fi_getname(&ep->fid, ai.name, &len));
	CHECK(write(s->sock, &ai, sizeof ai) == (ssize_t)sizeof ai, "sending the region");
	char c;
	CHECK(read(s->sock, &c, 1) == 1, "waiting for the initiator"); /* no libfabric call meanwhile */
	CHECK(filled(mem, 64, 9), "the bytes written with automatic progress");
	OK(fi_close(&mr->fid));
	OK(fi_close(&ep->fid));
	OK(fi_close(&cq->fid));
	OK(fi_close(&av->fid));
	OK(fi_close(&domain->fid));
	OK(fi_close(&fabric->fid));
	fi_freeinfo(info);
	free(mem);
}

static void auto_initiator(struct side *s, char *buf)
{
	struct auto_info ai;
	char ctx[16], back[64] = { 0 };
	fi_addr_t t;
	CHECK(read(s->sock, &ai, sizeof ai) == (ssize_t)sizeof ai, "reading the automatic target's region");
	CHECK(fi_av_insert(s->av, ai.name, 1, &t, 0, NULL) == 1, "inserting the automatic target");
	fill(buf, 64, 9);
	OK(fi_write(s->ep, buf, 64, NULL, t, ai.addr, ai.key, ctx));
	CHECK(rma_done(s, FI_RMA | FI_WRITE) == 0, "a write to a target that makes no calls");
	OK(fi_read(s->ep, back, 64, NULL, t, ai.addr, ai.key, ctx));
	CHECK(rma_done(s, FI_RMA | FI_READ) == 0 && filled(back, 64, 9), "a read from a target that makes no calls");
	CHECK(write(s->sock, "d", 1) == 1, "telling the automatic target it is done");
}

/* A wait object: the receiver opens an endpoint whose queue has FI_WAIT_FD, posts a receive,
 * and sleeps on the queue's descriptor (fi_control FI_GETWAIT) whenever fi_trywait allows;
 * the sender sends 200 ms later. The descriptor must turn readable (within 5 s) and the
 * message then be read; the receiver must have slept on it at least once. Meanwhile a domain
 * with automatic progress is open, so the provider's thread runs beside the sleeper (it must
 * not disarm the doorbell the sleeper is armed on). */
static void waitfd_receiver(struct side *s)
{
	struct fid_ep *ep;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = FI_WAIT_FD };
	char peer[8], name[8], buf[16] = { 0 }, ctx[16];
	size_t len = sizeof peer;
	fi_addr_t pa;
	int fd = -1, slept = 0, got = 0;
	struct fi_info *ah = hints_base(), *ainfo;
	struct fid_fabric *afab;
	struct fid_domain *adom;
	ah->domain_attr->data_progress = FI_PROGRESS_AUTO;
	OK(fi_getinfo(V, NULL, NULL, 0, ah, &ainfo));
	fi_freeinfo(ah);
	OK(fi_fabric(ainfo->fabric_attr, &afab, NULL));
	OK(fi_domain(afab, ainfo, &adom, NULL));
	OK(fi_endpoint(s->domain, s->info, &ep, NULL));
	OK(fi_av_open(s->domain, &av_attr, &av, NULL));
	OK(fi_cq_open(s->domain, &cq_attr, &cq, NULL));
	OK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	OK(fi_ep_bind(ep, &av->fid, 0));
	OK(fi_enable(ep));
	OK(fi_av_lookup(s->av, s->peer, peer, &len));
	CHECK(fi_av_insert(av, peer, 1, &pa, 0, NULL) == 1, "inserting the sender");
	len = sizeof name;
	OK(fi_getname(&ep->fid, name, &len));
	OK(fi_control(&cq->fid, FI_GETWAIT, &fd));
	CHECK(fd >= 0, "the queue's descriptor: %d", fd);
	OK(fi_recv(ep, buf, sizeof buf, NULL, FI_ADDR_UNSPEC, ctx));
	CHECK(write(s->sock, name, sizeof name) == (ssize_t)sizeof name, "sending the name");
	struct fid *fids[1] = { &cq->fid };
	for (int round = 0; round < 100 && !got; round++) {
		int t = fi_trywait(s->fabric, fids, 1);
		CHECK(t == 0 || t == -FI_EAGAIN, "fi_trywait: %d", t);
		if (t == 0) {
			struct pollfd p = { .fd = fd, .events = POLLIN };
			CHECK(poll(&p, 1, 5000) == 1, "the descriptor never turned readable");
			slept = 1;
		}
		struct fi_cq_tagged_entry e;
		ssize_t r = fi_cq_read(cq, &e, 1);
		CHECK(r == 1 || r == -FI_EAGAIN, "reading the queue: %zd", r);
		got = r == 1;
	}
	CHECK(got && !memcmp(buf, "wake", 4), "the message for the sleeper: got %d, %.4s", got, buf);
	CHECK(slept, "the receiver never slept on the descriptor");
	OK(fi_close(&ep->fid));
	OK(fi_close(&cq->fid));
	OK(fi_close(&av->fid));
	OK(fi_close(&adom->fid));
	OK(fi_close(&afab->fid));
	fi_freeinfo(ainfo);
}

static void waitfd_sender(struct side *s)
{
	char name[8], ctx[16];
	fi_addr_t t;
	CHECK(read(s->sock, name, sizeof name) == (ssize_t)sizeof name, "reading the sleeper's name");
	CHECK(fi_av_insert(s->av, name, 1, &t, 0, NULL) == 1, "inserting the sleeper");
	usleep(200000);
	OK(fi_send(s->ep, "wake", 4, NULL, t, ctx));
	expect_one(s, FI_SEND | FI_MSG, NULL);
}

/* A stranger: a process of its own, so a node none of the receiver's vectors names, sends the
 * receiver a tagged message and writes into memory it registered. The write is refused
 * (FI_EACCES); the message reaches no receive while the receiver has not inserted the
 * stranger (a receive posted for it stays empty), and once it does, the message arrives,
 * held and not lost, with the stranger's new address as its source. */
static void close_side(struct side *s);

struct stranger_info {
	uint64_t addr, key;
	char name[8];
};

static void stranger_child(int in, int out, const char *target)
{
	struct side st = { 0 };
	struct stranger_info info;
	struct fi_cq_tagged_entry e;
	char name[8], ctx[16], word[8] = "intruder";
	size_t len = sizeof name;
	fi_addr_t t;
	role = "stranger";
	open_side(&st, FI_AV_TABLE);
	OK(fi_getname(&st.ep->fid, name, &len));
	CHECK(write(out, name, sizeof name) == (ssize_t)sizeof name, "telling the sender my name");
	CHECK(read(in, &info, sizeof info) == (ssize_t)sizeof info, "reading the receiver's region");
	CHECK(fi_av_insert(st.av, target, 1, &t, 0, NULL) == 1, "inserting the receiver");
	OK(fi_tsend(st.ep, "stranger", 8, NULL, t, 0x777, ctx));
	CHECK(next(&st, &e, NULL) == 1, "the stranger's send");
	OK(fi_write(st.ep, word, sizeof word, NULL, t, info.addr, info.key, ctx));
	CHECK(rma_done(&st, 0) == FI_EACCES, "a stranger's write was not refused");
	CHECK(write(out, "r", 1) == 1, "reporting");
	char c;
	CHECK(read(in, &c, 1) == 1, "waiting to leave");
	close_side(&st);
	exit(0);
}

static void stranger_sender(struct side *s)
{
	int down[2], up[2], status = 0;
	char target[8], name[8], c;
	size_t len = sizeof target;
	struct stranger_info info;
	OK(fi_av_lookup(s->av, s->peer, target, &len));
	CHECK(read(s->sock, &info, sizeof info) == (ssize_t)sizeof info, "reading the region for the stranger");
	CHECK(pipe(down) == 0 && pipe(up) == 0, "pipes");
	pid_t child = fork();
	if (child == 0) {
		close(down[1]);
		close(up[0]);
		stranger_child(down[0], up[1], target);
	}
	close(down[0]);
	close(up[1]);
	CHECK(read(up[0], name, sizeof name) == (ssize_t)sizeof name, "the stranger's name");
	CHECK(write(s->sock, name, sizeof name) == (ssize_t)sizeof name, "passing the stranger's name on");
	CHECK(write(down[1], &info, sizeof info) == (ssize_t)sizeof info, "passing the region on");
	CHECK(read(up[0], &c, 1) == 1 && c == 'r', "the stranger's report");
	CHECK(write(s->sock, "r", 1) == 1, "passing the report on");
	CHECK(read(s->sock, &c, 1) == 1, "waiting for the receiver");
	CHECK(write(down[1], "x", 1) == 1, "letting the stranger go");
	waitpid(child, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the stranger failed");
}

static void stranger_receiver(struct side *s)
{
	char *mem = calloc(1, 64), buf[16] = { 0 }, name[8], c, ctx[16];
	struct fid_mr *mr;
	struct stranger_info info = { 0 };
	struct fi_cq_tagged_entry e;
	fi_addr_t from = 0, stranger;
	OK(fi_mr_reg(s->domain, mem, 64, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL));
	info.addr = (uint64_t)(uintptr_t)mem;
	info.key = fi_mr_key(mr);
	OK(fi_trecv(s->ep, buf, sizeof buf, NULL, FI_ADDR_UNSPEC, 0x777, 0, ctx));
	CHECK(write(s->sock, &info, sizeof info) == (ssize_t)sizeof info, "sending the region");
	CHECK(read(s->sock, name, sizeof name) == (ssize_t)sizeof name, "the stranger's name");
	/* Progress (the stranger's write is refused by this process's provider) until the
	 * stranger says it is done, and 100 ms more: nothing may complete meanwhile. */
	int reported = 0;
	for (int i = 0; i < 10000 && reported < 100; i++) {
		ssize_t r = fi_cq_readfrom(s->cq, &e, 1, &from);
		CHECK(r == -FI_EAGAIN, "a stranger's message reached a receive: %zd", r);
		if (reported)
			reported++;
		else if (recv(s->sock, &c, 1, MSG_DONTWAIT) == 1)
			reported = c == 'r' ? 1 : -1000000;
		usleep(1000);
	}
	CHECK(reported >= 100, "the stranger never reported");
	CHECK(!memcmp(mem, (char[64]){ 0 }, 64), "a stranger wrote into registered memory");
	CHECK(fi_av_insert(s->av, name, 1, &stranger, 0, NULL) == 1, "inserting the stranger");
	e = expect_one(s, FI_RECV | FI_TAGGED, &from);
	CHECK(e.tag == 0x777 && !memcmp(buf, "stranger", 8) && from == stranger,
	      "the held message: tag %llx, from %llu (stranger %llu)", (unsigned long long)e.tag,
	      (unsigned long long)from, (unsigned long long)stranger);
	CHECK(write(s->sock, "d", 1) == 1, "done with the stranger");
	OK(fi_close(&mr->fid));
	free(mem);
}

static void sender(struct side *s)
{
	char ctx[8][16];
	char *big = malloc(BIG);
	struct fi_cq_tagged_entry e;

	/* 1: sent before the receive is posted, with data. */
	OK(fi_tsenddata(s->ep, "early", 5, NULL, 77, s->peer, 0x100, ctx[0]));
	e = expect_one(s, FI_SEND | FI_TAGGED, NULL);
	CHECK(e.op_context == ctx[0], "send completion context");
	sync_step(s);
	/* 2: 3 MiB into a posted receive, then 3 MiB before the receive. */
	fill(big, BIG, 1);
	sync_step(s); /* the receive is posted */
	OK(fi_tsend(s->ep, big, BIG, NULL, s->peer, 0x200, ctx[1]));
	expect_one(s, FI_SEND, NULL);
	fill(big, BIG, 2);
	OK(fi_tsend(s->ep, big, BIG, NULL, s->peer, 0x201, ctx[1]));
	/* Its pieces wait for room at the receiver, which takes them once it reads again. */
	sync_step(s);
	expect_one(s, FI_SEND, NULL);
	/* 3: truncation; 4: peek and claim; 5: ignore bits; 6: inject; 7: a plain message. */
	OK(fi_tsend(s->ep, big, 100, NULL, s->peer, 0x300, ctx[2]));
	expect_one(s, FI_SEND, NULL);
	OK(fi_tsend(s->ep, "peekme", 6, NULL, s->peer, 0x400, ctx[3]));
	expect_one(s, FI_SEND, NULL);
	OK(fi_tsend(s->ep, "ignored", 7, NULL, s->peer, 0x6ab, ctx[4]));
	expect_one(s, FI_SEND, NULL);
	OK(fi_tinject(s->ep, "inj", 3, s->peer, 0x700));
	OK(fi_send(s->ep, "plain", 5, NULL, s->peer, ctx[5]));
	expect_one(s, FI_SEND | FI_MSG, NULL);
	sync_step(s);
	rma_initiator(s, big);
	auto_initiator(s, big);
	waitfd_sender(s);
	stranger_sender(s);
	/* Three messages for the receiver's buffer of many messages. */
	const char *parts[3] = { "m1", "m22", "m333" };
	for (int i = 0; i < 3; i++) {
		OK(fi_send(s->ep, parts[i], strlen(parts[i]), NULL, s->peer, ctx[5]));
		expect_one(s, FI_SEND | FI_MSG, NULL);
	}
	/* Bad use: an address not in the vector; RMA and atomics, not offered; a busy queue. */
	CHECK(fi_tsend(s->ep, "x", 1, NULL, 99, 1, ctx[6]) == -FI_EINVAL, "a send to an unknown address");
	size_t count = 0;
	CHECK(fi_atomicvalid(s->ep, FI_UINT64, FI_SUM, &count) == 0 && count > 0, "64-bit sums are not valid");
	CHECK(fi_atomicvalid(s->ep, FI_DOUBLE, FI_BOR, &count) != 0, "a bitwise or of doubles was called valid");
	CHECK(fi_compare_atomicvalid(s->ep, FI_UINT64, FI_CSWAP, &count) == 0, "compare-and-swap is not valid");
	CHECK(fi_fetch_atomicvalid(s->ep, FI_UINT64, FI_CSWAP, &count) != 0, "a fetching compare was called valid");
	CHECK(fi_close(&s->cq->fid) == -FI_EBUSY, "a bound queue closed");
	CHECK(fi_cntr_read(s->tx_cntr) == 12, "send counter %llu, expected 12",
	      (unsigned long long)fi_cntr_read(s->tx_cntr));
	/* The peer leaves: a send to it ends in an error completion, not a hang. */
	sync_step(s);
	char c;
	CHECK(read(s->sock, &c, 1) == 0, "the peer should have gone");
	int failed = 0;
	for (int i = 0; i < 400 && !failed; i++) {
		ssize_t r = fi_tsend(s->ep, big, 200000, NULL, s->peer, 0x900, ctx[7]);
		CHECK(r == 0 || r == -FI_EAGAIN, "a send to a gone peer: %zd", r);
		r = next(s, &e, NULL);
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry err = { 0 };
			CHECK(fi_cq_readerr(s->cq, &err, 0) == 1, "reading the error");
			CHECK(err.err == FI_EHOSTUNREACH || err.err == FI_EIO, "error %d", err.err);
			failed = 1;
		}
		usleep(5000);
	}
	CHECK(failed, "sends to a peer that left never failed");
	free(big);
}

static void receiver(struct side *s)
{
	char buf[64], ctx[8][16];
	char *big = malloc(BIG);
	struct fi_cq_tagged_entry e;
	fi_addr_t from;

	sync_step(s); /* the early message was sent */
	usleep(20000);
	OK(fi_trecv(s->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, 0x100, 0, ctx[0]));
	e = expect_one(s, FI_RECV | FI_TAGGED | FI_REMOTE_CQ_DATA, &from);
	CHECK(e.len == 5 && !memcmp(buf, "early", 5) && e.data == 77 && e.tag == 0x100, "early message: len %zu data %llu",
	      e.len, (unsigned long long)e.data);
	CHECK(from == s->peer, "the source address %llu is not the sender's %llu", (unsigned long long)from,
	      (unsigned long long)s->peer);
	OK(fi_trecv(s->ep, big, BIG, NULL, s->peer, 0x200, 0, ctx[1]));
	sync_step(s);
	e = expect_one(s, FI_RECV, NULL);
	CHECK(e.len == BIG && filled(big, BIG, 1), "3 MiB into a posted receive: len %zu", e.len);
	sync_step(s); /* the second 3 MiB was sent before its receive */
	usleep(20000);
	memset(big, 0, BIG);
	OK(fi_trecv(s->ep, big, BIG, NULL, FI_ADDR_UNSPEC, 0x201, 0, ctx[1]));
	e = expect_one(s, FI_RECV, NULL);
	CHECK(e.len == BIG && filled(big, BIG, 2), "3 MiB before its receive: len %zu", e.len);

	/* Truncation. */
	OK(fi_trecv(s->ep, buf, 10, NULL, FI_ADDR_UNSPEC, 0x300, 0, ctx[2]));
	CHECK(next(s, &e, NULL) == -FI_EAVAIL, "truncation is an error");
	struct fi_cq_err_entry err = { 0 };
	CHECK(fi_cq_readerr(s->cq, &err, 0) == 1 && err.err == FI_ETRUNC && err.olen == 90 && err.len == 10,
	      "truncation: err %d olen %zu len %zu", err.err, err.olen, err.len);
	const char *text = fi_cq_strerror(s->cq, err.prov_errno, err.err_data, NULL, 0);
	CHECK(text && strstr(text, "larger"), "its text: %s", text ? text : "(none)");

	/* Peek, then claim. */
	struct iovec none = { NULL, 0 };
	struct fi_msg_tagged peek = { .msg_iov = &none, .iov_count = 0, .addr = FI_ADDR_UNSPEC, .tag = 0x400,
				      .context = ctx[3] };
	/* Peeking until it is there, as applications do (FI_ENOMSG while it is not). */
	for (int tries = 0;; tries++) {
		OK(fi_trecvmsg(s->ep, &peek, FI_PEEK | FI_CLAIM));
		if (next(s, &e, NULL) == 1)
			break;
		CHECK(fi_cq_readerr(s->cq, &err, 0) == 1 && err.err == FI_ENOMSG && tries < 100000, "peeking: err %d",
		      err.err);
	}
	CHECK((e.flags & (FI_RECV | FI_TAGGED)) == (FI_RECV | FI_TAGGED), "peek completion flags");
	CHECK(e.len == 6 && e.op_context == ctx[3], "peek: len %zu", e.len);
	struct iovec into = { buf, sizeof(buf) };
	struct fi_msg_tagged claim = { .msg_iov = &into, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .tag = 0x400,
				       .context = ctx[3] };
	OK(fi_trecvmsg(s->ep, &claim, FI_CLAIM));
	e = expect_one(s, FI_RECV, NULL);
	CHECK(e.len == 6 && !memcmp(buf, "peekme", 6), "claimed message");
	OK(fi_trecvmsg(s->ep, &peek, FI_PEEK));
	CHECK(next(s, &e, NULL) == -FI_EAVAIL && fi_cq_readerr(s->cq, &err, 0) == 1 && err.err == FI_ENOMSG,
	      "a peek with nothing waiting: err %d", err.err);

	/* Ignore bits, inject, a plain message. */
	OK(fi_trecv(s->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, 0x600, 0xff, ctx[4]));
	e = expect_one(s, FI_RECV, NULL);
	CHECK(e.tag == 0x6ab && !memcmp(buf, "ignored", 7), "ignore bits: tag %llx", (unsigned long long)e.tag);
	OK(fi_trecv(s->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, 0x700, 0, ctx[5]));
	e = expect_one(s, FI_RECV, NULL);
	CHECK(e.len == 3 && !memcmp(buf, "inj", 3), "injected message");
	OK(fi_recv(s->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, ctx[6]));
	e = expect_one(s, FI_RECV | FI_MSG, NULL);
	CHECK(e.len == 5 && !memcmp(buf, "plain", 5), "plain message");
	sync_step(s);
	rma_target(s);
	auto_target(s);
	waitfd_receiver(s);
	stranger_receiver(s);

	/* A buffer of many messages (FI_MULTI_RECV), released when fewer than 8 bytes are left:
	 * three messages go in one after the other, the third says the buffer is released. */
	size_t min = 8, optlen = sizeof min;
	OK(fi_setopt(&s->ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, sizeof min));
	min = 0;
	OK(fi_getopt(&s->ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, &optlen));
	CHECK(min == 8, "FI_OPT_MIN_MULTI_RECV reads back %zu", min);
	char many[16] = { 0 };
	struct iovec mv = { many, sizeof many };
	struct fi_msg mm = { .msg_iov = &mv, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = ctx[2] };
	OK(fi_recvmsg(s->ep, &mm, FI_MULTI_RECV));
	size_t at[3] = { 0, 2, 5 }, len[3] = { 2, 3, 4 };
	for (int i = 0; i < 3; i++) {
		e = expect_one(s, FI_RECV | FI_MSG, NULL);
		CHECK((char *)e.buf == many + at[i] && e.len == len[i] && e.op_context == ctx[2],
		      "part %d of the buffer: at %td, len %zu", i, (char *)e.buf - many, e.len);
		CHECK(!!(e.flags & FI_MULTI_RECV) == (i == 2), "part %d: FI_MULTI_RECV %d", i, !!(e.flags & FI_MULTI_RECV));
	}
	CHECK(!memcmp(many, "m1m22m333", 9), "the buffer holds %.9s", many);

	/* Cancel. */
	OK(fi_trecv(s->ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, 0x500, 0, ctx[7]));
	OK(fi_cancel(&s->ep->fid, ctx[7]));
	CHECK(next(s, &e, NULL) == -FI_EAVAIL && fi_cq_readerr(s->cq, &err, 0) == 1 && err.err == FI_ECANCELED &&
		      err.op_context == ctx[7],
	      "cancel: err %d", err.err);
	CHECK(fi_cancel(&s->ep->fid, ctx[7]) == -FI_ENOENT, "cancelling twice");
	CHECK(fi_cntr_read(s->rx_cntr) == 11 && fi_cntr_readerr(s->rx_cntr) == 1, "receive counter %llu, errors %llu",
	      (unsigned long long)fi_cntr_read(s->rx_cntr), (unsigned long long)fi_cntr_readerr(s->rx_cntr));
	sync_step(s);
	free(big);
}

static void close_side(struct side *s)
{
	OK(fi_close(&s->ep->fid));
	OK(fi_close(&s->cq->fid));
	OK(fi_close(&s->av->fid));
	OK(fi_close(&s->tx_cntr->fid));
	OK(fi_close(&s->rx_cntr->fid));
	OK(fi_close(&s->domain->fid));
	OK(fi_close(&s->fabric->fid));
	fi_freeinfo(s->info);
}

int main(void)
{
	int sv[2];
	/* Before the fork on purpose: fi_getinfo joins the fabric (for the source address), so the
	 * child inherits a provider whose threads it does not have, and must join afresh. */
	check_getinfo();
	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
	pid_t b = fork();
	if (b == 0) {
		struct side s = { .sock = sv[1] };
		role = "receiver";
		close(sv[0]);
		open_side(&s, FI_AV_MAP);
		exchange_names(&s);
		receiver(&s);
		close_side(&s);
		printf("receiver ok\n");
		return 0;
	}
	close(sv[1]);
	struct side s = { .sock = sv[0] };
	role = "sender";
	open_side(&s, FI_AV_TABLE);
	exchange_names(&s);
	sender(&s);
	int status = 0;
	waitpid(b, &status, 0);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the receiver failed");
	printf("sender ok\n");
	return 0;
}
