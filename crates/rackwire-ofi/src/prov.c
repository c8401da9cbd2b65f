/*
 * The libfabric side of the rackwire provider: libfabric's objects (fabric, domain,
 * completion queue, counter, address vector, event queue, memory region) with their
 * operation tables, laid out by libfabric's own headers. Every operation that does
 * something is a call into the Rust side (rwofi_*, src/abi.rs), which holds the state; this
 * file only unpacks libfabric's arguments and packs its results. Endpoints are in
 * prov_ep.c, fi_getinfo's answer in prov_info.c.
 */
#include "provider.h"

/* ---- memory regions: registered with the Rust side, which checks every remote access ---- */
static int mr_close(struct fid *fid)
{
	struct rw_mr *m = OF(struct rw_mr, mr.fid, fid);
	int r = ret_int(rwofi_mr_close(m->mr.key));
	free(m);
	return r;
}
static struct fi_ops mr_fid_ops = FID_OPS(mr_close, rw_no_bind, rw_no_control);

static int mr_make(const void *buf, size_t len, uint64_t access, uint64_t flags, struct fid_mr **out, void *context)
{
	struct rw_mr *m;
	int64_t r;
	if (flags)
		return -FI_EBADFLAGS;
	if (!out || (!buf && len))
		return -FI_EINVAL;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -FI_ENOMEM;
	r = rwofi_mr_reg(buf, len, access, &m->mr.key);
	if (r < 0) {
		free(m);
		return (int)r;
	}
	m->mr.fid.fclass = FI_CLASS_MR;
	m->mr.fid.context = context;
	m->mr.fid.ops = &mr_fid_ops;
	m->mr.mem_desc = NULL;
	*out = &m->mr;
	return 0;
}
/* Keys are the provider's (FI_MR_PROV_KEY): a requested key is not used. */
static int mr_reg(struct fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
		  uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context)
{
	(void)fid; (void)offset; (void)requested_key;
	return mr_make(buf, len, access, flags, mr, context);
}
static int mr_regv(struct fid *fid, const struct iovec *iov, size_t count, uint64_t access, uint64_t offset,
		   uint64_t requested_key, uint64_t flags, struct fid_mr **mr, void *context)
{
	(void)fid; (void)offset; (void)requested_key;
	if (count != 1 || !iov)
		return -FI_EINVAL;
	return mr_make(iov[0].iov_base, iov[0].iov_len, access, flags, mr, context);
}
static int mr_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr)
{
	(void)fid;
	if (!attr || attr->iov_count != 1 || !attr->mr_iov)
		return -FI_EINVAL;
	if (attr->iface != FI_HMEM_SYSTEM)
		return -FI_ENOSYS;
	return mr_make(attr->mr_iov[0].iov_base, attr->mr_iov[0].iov_len, attr->access, flags, mr, attr->context);
}
static struct fi_ops_mr domain_mr_ops = {
	.size = sizeof(struct fi_ops_mr), .reg = mr_reg, .regv = mr_regv, .regattr = mr_regattr,
};

/* ---- completion queues ---- */
static int cq_close(struct fid *fid)
{
	struct rw_cq *cq = OF(struct rw_cq, cq.fid, fid);
	int r = ret_int(rwofi_cq_close(cq->h));
	if (r)
		return r;
	free(cq);
	return 0;
}
static int cq_control(struct fid *fid, int command, void *arg)
{
	struct rw_cq *cq = OF(struct rw_cq, cq.fid, fid);
	int64_t fd;
	if (command != FI_GETWAIT)
		return -FI_ENOSYS;
	if (!cq->wait_fd)
		return -FI_ENODATA;
	if (!arg)
		return -FI_EINVAL;
	fd = rwofi_wait_fd();
	if (fd < 0)
		return (int)fd;
	*(int *)arg = (int)fd;
	return 0;
}
static struct fi_ops cq_fid_ops = FID_OPS(cq_close, rw_no_bind, cq_control);

static ssize_t cq_read(struct fid_cq *c, void *buf, size_t count)
{
	return rwofi_cq_read(OF(struct rw_cq, cq, c)->h, buf, count, NULL, 0, 0);
}
static ssize_t cq_readfrom(struct fid_cq *c, void *buf, size_t count, fi_addr_t *src)
{
	return rwofi_cq_read(OF(struct rw_cq, cq, c)->h, buf, count, src, 0, 0);
}
static ssize_t cq_sread(struct fid_cq *c, void *buf, size_t count, const void *cond, int timeout)
{
	(void)cond;
	return rwofi_cq_read(OF(struct rw_cq, cq, c)->h, buf, count, NULL, 1, timeout);
}
static ssize_t cq_sreadfrom(struct fid_cq *c, void *buf, size_t count, fi_addr_t *src, const void *cond, int timeout)
{
	(void)cond;
	return rwofi_cq_read(OF(struct rw_cq, cq, c)->h, buf, count, src, 1, timeout);
}
static ssize_t cq_readerr(struct fid_cq *c, struct fi_cq_err_entry *buf, uint64_t flags)
{
	struct rwofi_err e;
	int64_t r;
	(void)flags;
	if (!buf)
		return -FI_EINVAL;
	r = rwofi_cq_readerr(OF(struct rw_cq, cq, c)->h, &e);
	if (r < 0)
		return r;
	buf->op_context = (void *)e.op_context;
	buf->flags = e.flags;
	buf->len = e.len;
	buf->buf = (void *)e.buf;
	buf->data = e.data;
	buf->tag = e.tag;
	buf->olen = e.olen;
	buf->err = e.err;
	buf->prov_errno = e.prov_errno;
	buf->err_data = NULL;
	buf->err_data_size = 0;
	return 1;
}
static int cq_signal(struct fid_cq *c)
{
	return ret_int(rwofi_cq_signal(OF(struct rw_cq, cq, c)->h));
}
static const char *cq_strerror(struct fid_cq *c, int prov_errno, const void *err_data, char *buf, size_t len)
{
	const char *text = rwofi_strerror(prov_errno);
	(void)c; (void)err_data;
	if (buf && len) {
		snprintf(buf, len, "%s", text);
		return buf;
	}
	return text;
}
static struct fi_ops_cq cq_ops = {
	.size = sizeof(struct fi_ops_cq), .read = cq_read, .readfrom = cq_readfrom, .readerr = cq_readerr,
	.sread = cq_sread, .sreadfrom = cq_sreadfrom, .signal = cq_signal, .strerror = cq_strerror,
};

static int cq_open(struct fid_domain *d, struct fi_cq_attr *attr, struct fid_cq **out, void *context)
{
	struct rw_cq *cq;
	int64_t r;
	(void)d;
	if (!attr || !out)
		return -FI_EINVAL;
	/* Blocking reads sleep on the fabric's doorbell; with FI_WAIT_FD the application may sleep
	 * on its descriptor itself (fi_control FI_GETWAIT, after fi_trywait). */
	if (attr->wait_obj != FI_WAIT_NONE && attr->wait_obj != FI_WAIT_UNSPEC && attr->wait_obj != FI_WAIT_YIELD &&
	    attr->wait_obj != FI_WAIT_FD)
		return -FI_ENOSYS;
	if (attr->wait_cond != FI_CQ_COND_NONE)
		return -FI_ENOSYS;
	cq = calloc(1, sizeof(*cq));
	if (!cq)
		return -FI_ENOMEM;
	r = rwofi_cq_open(attr->format, &cq->h);
	if (r < 0) {
		free(cq);
		return (int)r;
	}
	if (attr->format == FI_CQ_FORMAT_UNSPEC)
		attr->format = FI_CQ_FORMAT_CONTEXT;
	cq->wait_fd = attr->wait_obj == FI_WAIT_FD;
	cq->cq.fid.fclass = FI_CLASS_CQ;
	cq->cq.fid.context = context;
	cq->cq.fid.ops = &cq_fid_ops;
	cq->cq.ops = &cq_ops;
	*out = &cq->cq;
	return 0;
}

/* ---- counters ---- */
static int cntr_close(struct fid *fid)
{
	struct rw_cntr *c = OF(struct rw_cntr, c.fid, fid);
	int r = ret_int(rwofi_cntr_close(c->h));
	if (r)
		return r;
	free(c);
	return 0;
}
static struct fi_ops cntr_fid_ops = FID_OPS(cntr_close, rw_no_bind, rw_no_control);
#define CNTR(p) (OF(struct rw_cntr, c, p)->h)
static uint64_t cntr_read(struct fid_cntr *c) { return rwofi_cntr_read(CNTR(c), 0); }
static uint64_t cntr_readerr(struct fid_cntr *c) { return rwofi_cntr_read(CNTR(c), 1); }
static int cntr_add(struct fid_cntr *c, uint64_t v) { return ret_int(rwofi_cntr_change(CNTR(c), 0, 1, v)); }
static int cntr_set(struct fid_cntr *c, uint64_t v) { return ret_int(rwofi_cntr_change(CNTR(c), 0, 0, v)); }
static int cntr_adderr(struct fid_cntr *c, uint64_t v) { return ret_int(rwofi_cntr_change(CNTR(c), 1, 1, v)); }
static int cntr_seterr(struct fid_cntr *c, uint64_t v) { return ret_int(rwofi_cntr_change(CNTR(c), 1, 0, v)); }
static int cntr_wait(struct fid_cntr *c, uint64_t threshold, int timeout)
{
	return ret_int(rwofi_cntr_wait(CNTR(c), threshold, timeout));
}
static struct fi_ops_cntr cntr_ops = {
	.size = sizeof(struct fi_ops_cntr), .read = cntr_read, .readerr = cntr_readerr, .add = cntr_add,
	.set = cntr_set, .wait = cntr_wait, .adderr = cntr_adderr, .seterr = cntr_seterr,
};
static int cntr_open(struct fid_domain *d, struct fi_cntr_attr *attr, struct fid_cntr **out, void *context)
{
	struct rw_cntr *c;
	int64_t r;
	(void)d;
	if (attr && attr->events != FI_CNTR_EVENTS_COMP)
		return -FI_ENOSYS;
	if (attr && attr->wait_obj != FI_WAIT_NONE && attr->wait_obj != FI_WAIT_UNSPEC && attr->wait_obj != FI_WAIT_YIELD)
		return -FI_ENOSYS;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -FI_ENOMEM;
	r = rwofi_cntr_open(&c->h);
	if (r < 0) {
		free(c);
		return (int)r;
	}
	c->c.fid.fclass = FI_CLASS_CNTR;
	c->c.fid.context = context;
	c->c.fid.ops = &cntr_fid_ops;
	c->c.ops = &cntr_ops;
	*out = &c->c;
	return 0;
}

/* ---- address vectors ---- */
static int av_close(struct fid *fid)
{
	struct rw_av *av = OF(struct rw_av, av.fid, fid);
	int r = ret_int(rwofi_av_close(av->h));
	if (r)
		return r;
	free(av);
	return 0;
}
static struct fi_ops av_fid_ops = FID_OPS(av_close, rw_no_bind, rw_no_control);
#define AV(p) (OF(struct rw_av, av, p)->h)
static int av_insert(struct fid_av *av, const void *addr, size_t count, fi_addr_t *fi_addr, uint64_t flags, void *context)
{
	(void)context;
	if (flags & ~(uint64_t)FI_MORE)
		return -FI_EBADFLAGS;
	return (int)rwofi_av_insert(AV(av), addr, count, fi_addr);
}
static int av_insertsvc(struct fid_av *av, const char *node, const char *service, fi_addr_t *fi_addr, uint64_t flags,
			void *context)
{
	(void)av; (void)node; (void)service; (void)fi_addr; (void)flags; (void)context;
	return -FI_ENOSYS;
}
static int av_insertsym(struct fid_av *av, const char *node, size_t nodecnt, const char *service, size_t svccnt,
			fi_addr_t *fi_addr, uint64_t flags, void *context)
{
	(void)av; (void)node; (void)nodecnt; (void)service; (void)svccnt; (void)fi_addr; (void)flags; (void)context;
	return -FI_ENOSYS;
}
static int av_remove(struct fid_av *av, fi_addr_t *fi_addr, size_t count, uint64_t flags)
{
	(void)flags;
	return ret_int(rwofi_av_remove(AV(av), fi_addr, count));
}
static int av_lookup(struct fid_av *av, fi_addr_t fa, void *addr, size_t *addrlen)
{
	return ret_int(rwofi_av_lookup(AV(av), fa, addr, addrlen));
}
static const char *av_straddr(struct fid_av *av, const void *addr, char *buf, size_t *len)
{
	uint32_t node = 0, ep = 0;
	int n;
	(void)av;
	if (!addr || !buf || !len)
		return NULL;
	memcpy(&node, addr, 4);
	memcpy(&ep, (const char *)addr + 4, 4);
	n = snprintf(buf, *len, "fi_rackwire://%u:%u", node, ep);
	*len = n < 0 ? 0 : (size_t)n + 1;
	return buf;
}
static int av_set(struct fid_av *av, struct fi_av_set_attr *attr, struct fid_av_set **set, void *context)
{
	(void)av; (void)attr; (void)set; (void)context;
	return -FI_ENOSYS;
}
static struct fi_ops_av av_ops = {
	.size = sizeof(struct fi_ops_av), .insert = av_insert, .insertsvc = av_insertsvc, .insertsym = av_insertsym,
	.remove = av_remove, .lookup = av_lookup, .straddr = av_straddr, .av_set = av_set,
};
static int av_open(struct fid_domain *d, struct fi_av_attr *attr, struct fid_av **out, void *context)
{
	struct rw_av *av;
	int64_t r;
	(void)d;
	if (!attr || !out)
		return -FI_EINVAL;
	if (attr->flags & FI_EVENT || attr->name)
		return -FI_ENOSYS; /* no asynchronous inserts, no shared (named) vectors */
	av = calloc(1, sizeof(*av));
	if (!av)
		return -FI_ENOMEM;
	r = rwofi_av_open(attr->type, &av->h);
	if (r < 0) {
		free(av);
		return (int)r;
	}
	av->av.fid.fclass = FI_CLASS_AV;
	av->av.fid.context = context;
	av->av.fid.ops = &av_fid_ops;
	av->av.ops = &av_ops;
	*out = &av->av;
	return 0;
}

/* ---- event queues: RDM endpoints raise no events here (inserts are synchronous) ---- */
static int eq_close(struct fid *fid)
{
	free(OF(struct rw_eq, eq.fid, fid));
	return 0;
}
static struct fi_ops eq_fid_ops = FID_OPS(eq_close, rw_no_bind, rw_no_control);
static ssize_t eq_read(struct fid_eq *eq, uint32_t *event, void *buf, size_t len, uint64_t flags)
{
	(void)eq; (void)event; (void)buf; (void)len; (void)flags;
	return -FI_EAGAIN;
}
static ssize_t eq_readerr(struct fid_eq *eq, struct fi_eq_err_entry *buf, uint64_t flags)
{
	(void)eq; (void)buf; (void)flags;
	return -FI_EAGAIN;
}
static ssize_t eq_write(struct fid_eq *eq, uint32_t event, const void *buf, size_t len, uint64_t flags)
{
	(void)eq; (void)event; (void)buf; (void)len; (void)flags;
	return -FI_ENOSYS;
}
static ssize_t eq_sread(struct fid_eq *eq, uint32_t *event, void *buf, size_t len, int timeout, uint64_t flags)
{
	(void)eq; (void)event; (void)buf; (void)len; (void)flags;
	if (timeout > 0) {
		struct timespec ts = { timeout / 1000, (long)(timeout % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	return -FI_EAGAIN;
}
static const char *eq_strerror(struct fid_eq *eq, int prov_errno, const void *err_data, char *buf, size_t len)
{
	(void)eq; (void)err_data;
	if (buf && len) {
		snprintf(buf, len, "%s", rwofi_strerror(prov_errno));
		return buf;
	}
	return rwofi_strerror(prov_errno);
}
static struct fi_ops_eq eq_ops = {
	.size = sizeof(struct fi_ops_eq), .read = eq_read, .readerr = eq_readerr, .write = eq_write,
	.sread = eq_sread, .strerror = eq_strerror,
};
static int eq_open(struct fid_fabric *f, struct fi_eq_attr *attr, struct fid_eq **out, void *context)
{
	struct rw_eq *eq;
	(void)f;
	if (attr && attr->wait_obj != FI_WAIT_NONE && attr->wait_obj != FI_WAIT_UNSPEC)
		return -FI_ENOSYS;
	eq = calloc(1, sizeof(*eq));
	if (!eq)
		return -FI_ENOMEM;
	eq->eq.fid.fclass = FI_CLASS_EQ;
	eq->eq.fid.context = context;
	eq->eq.fid.ops = &eq_fid_ops;
	eq->eq.ops = &eq_ops;
	*out = &eq->eq;
	return 0;
}


/* ---- domains ---- */
static size_t ofi_datatype_size(enum fi_datatype dt)
{
	switch (dt) {
	case FI_INT8: case FI_UINT8: return 1;
	case FI_INT16: case FI_UINT16: return 2;
	case FI_INT32: case FI_UINT32: case FI_FLOAT: return 4;
	case FI_INT64: case FI_UINT64: case FI_DOUBLE: return 8;
	default: return 0;
	}
}
static int domain_close(struct fid *fid)
{
	struct rw_domain *dom = OF(struct rw_domain, d.fid, fid);
	rwofi_domain_close(dom->auto_progress);
	free(dom);
	return 0;
}
static struct fi_ops domain_fid_ops = FID_OPS(domain_close, rw_no_bind, rw_no_control);
static int no_scalable_ep(struct fid_domain *d, struct fi_info *info, struct fid_ep **sep, void *context)
{
	(void)d; (void)info; (void)sep; (void)context;
	return -FI_ENOSYS;
}
static int no_poll_open(struct fid_domain *d, struct fi_poll_attr *attr, struct fid_poll **p)
{
	(void)d; (void)attr; (void)p;
	return -FI_ENOSYS;
}
static int no_stx(struct fid_domain *d, struct fi_tx_attr *attr, struct fid_stx **stx, void *context)
{
	(void)d; (void)attr; (void)stx; (void)context;
	return -FI_ENOSYS;
}
static int no_srx(struct fid_domain *d, struct fi_rx_attr *attr, struct fid_ep **rx, void *context)
{
	(void)d; (void)attr; (void)rx; (void)context;
	return -FI_ENOSYS;
}
static int query_atomic(struct fid_domain *d, enum fi_datatype dt, enum fi_op op, struct fi_atomic_attr *attr,
			uint64_t flags)
{
	int form = flags & FI_COMPARE_ATOMIC ? RW_ATOMIC_COMPARE : flags & FI_FETCH_ATOMIC ? RW_ATOMIC_FETCH : RW_ATOMIC_WRITE;
	size_t count = 0;
	int r;
	(void)d;
	if (!attr)
		return -FI_EINVAL;
	r = ret_int(rwofi_atomic_valid((int)dt, (int)op, form, &count));
	if (r)
		return r;
	attr->count = count;
	attr->size = ofi_datatype_size(dt);
	return 0;
}
static int no_query_collective(struct fid_domain *d, enum fi_collective_op coll, struct fi_collective_attr *attr,
			       uint64_t flags)
{
	(void)d; (void)coll; (void)attr; (void)flags;
	return -FI_EOPNOTSUPP;
}
static int endpoint2(struct fid_domain *d, struct fi_info *info, struct fid_ep **ep, uint64_t flags, void *context)
{
	if (flags)
		return -FI_EBADFLAGS;
	return rw_ep_open(d, info, ep, context);
}
static struct fi_ops_domain domain_ops = {
	.size = sizeof(struct fi_ops_domain), .av_open = av_open, .cq_open = cq_open, .endpoint = rw_ep_open,
	.scalable_ep = no_scalable_ep, .cntr_open = cntr_open, .poll_open = no_poll_open, .stx_ctx = no_stx,
	.srx_ctx = no_srx, .query_atomic = query_atomic, .query_collective = no_query_collective,
	.endpoint2 = endpoint2,
};
static int domain_open(struct fid_fabric *f, struct fi_info *info, struct fid_domain **out, void *context)
{
	struct rw_domain *dom;
	int64_t r;
	(void)f;
	if (info && info->domain_attr && info->domain_attr->name && strcmp(info->domain_attr->name, RW_PROV_NAME))
		return -FI_EINVAL;
	dom = calloc(1, sizeof(*dom));
	if (!dom)
		return -FI_ENOMEM;
	dom->auto_progress = info && info->domain_attr &&
			     (info->domain_attr->data_progress == FI_PROGRESS_AUTO ||
			      info->domain_attr->control_progress == FI_PROGRESS_AUTO);
	r = rwofi_domain_open(dom->auto_progress);
	if (r < 0) {
		free(dom);
		return (int)r;
	}
	dom->d.fid.fclass = FI_CLASS_DOMAIN;
	dom->d.fid.context = context;
	dom->d.fid.ops = &domain_fid_ops;
	dom->d.ops = &domain_ops;
	dom->d.mr = &domain_mr_ops;
	*out = &dom->d;
	return 0;
}

/* ---- fabrics ---- */
static int fabric_close(struct fid *fid)
{
	free(OF(struct rw_fabric, f.fid, fid));
	return 0;
}
static struct fi_ops fabric_fid_ops = FID_OPS(fabric_close, rw_no_bind, rw_no_control);
static int no_passive_ep(struct fid_fabric *f, struct fi_info *info, struct fid_pep **pep, void *context)
{
	(void)f; (void)info; (void)pep; (void)context;
	return -FI_ENOSYS;
}
static int no_wait_open(struct fid_fabric *f, struct fi_wait_attr *attr, struct fid_wait **w)
{
	(void)f; (void)attr; (void)w;
	return -FI_ENOSYS;
}
/* Whether the application may sleep on the queues' descriptor now: 0 when nothing waits in
 * them nor in the fabric (its doorbell is then armed), -FI_EAGAIN when it should read first. */
static int trywait(struct fid_fabric *f, struct fid **fids, int count)
{
	uint64_t h[RW_TRYWAIT_MAX];
	(void)f;
	if (count < 0 || count > RW_TRYWAIT_MAX || (count && !fids))
		return -FI_EINVAL;
	for (int i = 0; i < count; i++) {
		if (!fids[i] || fids[i]->fclass != FI_CLASS_CQ)
			return -FI_EINVAL;
		h[i] = OF(struct rw_cq, cq.fid, fids[i])->h;
	}
	return ret_int(rwofi_trywait(h, (size_t)count));
}
static int domain2(struct fid_fabric *f, struct fi_info *info, struct fid_domain **d, uint64_t flags, void *context)
{
	if (flags)
		return -FI_EBADFLAGS;
	return domain_open(f, info, d, context);
}
static struct fi_ops_fabric fabric_ops = {
	.size = sizeof(struct fi_ops_fabric), .domain = domain_open, .passive_ep = no_passive_ep, .eq_open = eq_open,
	.wait_open = no_wait_open, .trywait = trywait, .domain2 = domain2,
};
static int fabric_open(struct fi_fabric_attr *attr, struct fid_fabric **out, void *context)
{
	struct rw_fabric *f;
	if (attr && attr->name && strcmp(attr->name, RW_PROV_NAME))
		return -FI_ENODATA;
	f = calloc(1, sizeof(*f));
	if (!f)
		return -FI_ENOMEM;
	f->f.fid.fclass = FI_CLASS_FABRIC;
	f->f.fid.context = context;
	f->f.fid.ops = &fabric_fid_ops;
	f->f.ops = &fabric_ops;
	f->f.api_version = attr ? attr->api_version : RW_FI_VERSION;
	*out = &f->f;
	return 0;
}


static void prov_cleanup(void) {}

static void register_fork_handler(void);

static struct fi_provider rw_prov = {
	.version = RW_PROV_VERSION,
	.fi_version = RW_FI_VERSION,
	.name = RW_PROV_NAME,
	.getinfo = rw_getinfo,
	.fabric = fabric_open,
	.cleanup = prov_cleanup,
};

/* The child of a fork: its provider state is its parent's, without the threads. */
static void after_fork_in_child(void)
{
	rwofi_forked();
}

static void register_fork_handler(void)
{
	pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* Called by the Rust side's fi_prov_ini (a cdylib exports only Rust's symbols), once per
 * process by libfabric. */
struct fi_provider *rwofi_c_provider(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	pthread_once(&once, register_fork_handler);
	return &rw_prov;
}
