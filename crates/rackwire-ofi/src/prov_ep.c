/*
 * Endpoints: binding, enabling, names, and the message, tagged, RMA and atomic operations.
 */
#include "provider.h"

#define EPH(p) (OF(struct rw_ep, ep, p)->h)

static int ep_close(struct fid *fid)
{
	struct rw_ep *ep = OF(struct rw_ep, ep.fid, fid);
	int r = ret_int(rwofi_ep_close(ep->h));
	if (r)
		return r;
	free(ep);
	return 0;
}
static int ep_bind(struct fid *fid, struct fid *bfid, uint64_t flags)
{
	struct rw_ep *ep = OF(struct rw_ep, ep.fid, fid);
	if (!bfid)
		return -FI_EINVAL;
	switch (bfid->fclass) {
	case FI_CLASS_CQ:
		return ret_int(rwofi_ep_bind(ep->h, 1, OF(struct rw_cq, cq.fid, bfid)->h, flags));
	case FI_CLASS_AV:
		return ret_int(rwofi_ep_bind(ep->h, 2, OF(struct rw_av, av.fid, bfid)->h, flags));
	case FI_CLASS_CNTR:
		return ret_int(rwofi_ep_bind(ep->h, 3, OF(struct rw_cntr, c.fid, bfid)->h, flags));
	case FI_CLASS_EQ:
		return 0; /* nothing here raises events */
	default:
		return -FI_EINVAL;
	}
}
static int ep_control(struct fid *fid, int command, void *arg)
{
	struct rw_ep *ep = OF(struct rw_ep, ep.fid, fid);
	uint64_t *flags = arg;
	switch (command) {
	case FI_ENABLE:
		return ret_int(rwofi_ep_enable(ep->h));
	case FI_GETOPSFLAG:
		if (!flags)
			return -FI_EINVAL;
		if (*flags & FI_TRANSMIT)
			*flags = ep->tx_flags;
		else if (*flags & FI_RECV)
			*flags = ep->rx_flags;
		else
			return -FI_EINVAL;
		return 0;
	case FI_SETOPSFLAG:
		if (!flags)
			return -FI_EINVAL;
		if (*flags & FI_TRANSMIT)
			ep->tx_flags = *flags & ~(uint64_t)FI_TRANSMIT;
		else if (*flags & FI_RECV)
			ep->rx_flags = *flags & ~(uint64_t)FI_RECV;
		else
			return -FI_EINVAL;
		return 0;
	default:
		return -FI_ENOSYS;
	}
}
static struct fi_ops ep_fid_ops = FID_OPS(ep_close, ep_bind, ep_control);

static ssize_t ep_cancel(fid_t fid, void *context)
{
	return rwofi_ep_cancel(OF(struct rw_ep, ep.fid, fid)->h, context);
}
/* FI_OPT_MIN_MULTI_RECV is the one option: the least room a buffer of many messages keeps. */
static int ep_getopt(fid_t fid, int level, int optname, void *optval, size_t *optlen)
{
	size_t v = 0;
	int r;
	if (level != FI_OPT_ENDPOINT || optname != FI_OPT_MIN_MULTI_RECV)
		return -FI_ENOPROTOOPT;
	if (!optval || !optlen || *optlen < sizeof(size_t))
		return -FI_ETOOSMALL;
	r = ret_int(rwofi_ep_min_multi_recv(OF(struct rw_ep, ep.fid, fid)->h, 0, &v));
	if (r)
		return r;
	memcpy(optval, &v, sizeof v);
	*optlen = sizeof v;
	return 0;
}
static int ep_setopt(fid_t fid, int level, int optname, const void *optval, size_t optlen)
{
	size_t v;
	if (level != FI_OPT_ENDPOINT || optname != FI_OPT_MIN_MULTI_RECV)
		return -FI_ENOPROTOOPT;
	if (!optval || optlen != sizeof(size_t))
		return -FI_EINVAL;
	memcpy(&v, optval, sizeof v);
	return ret_int(rwofi_ep_min_multi_recv(OF(struct rw_ep, ep.fid, fid)->h, 1, &v));
}
static int no_tx_ctx(struct fid_ep *sep, int index, struct fi_tx_attr *attr, struct fid_ep **tx, void *context)
{
	(void)sep; (void)index; (void)attr; (void)tx; (void)context;
	return -FI_ENOSYS;
}
static int no_rx_ctx(struct fid_ep *sep, int index, struct fi_rx_attr *attr, struct fid_ep **rx, void *context)
{
	(void)sep; (void)index; (void)attr; (void)rx; (void)context;
	return -FI_ENOSYS;
}
static ssize_t no_size_left(struct fid_ep *ep)
{
	(void)ep;
	return -FI_ENOSYS;
}
static struct fi_ops_ep ep_ops = {
	.size = sizeof(struct fi_ops_ep), .cancel = ep_cancel, .getopt = ep_getopt, .setopt = ep_setopt,
	.tx_ctx = no_tx_ctx, .rx_ctx = no_rx_ctx, .rx_size_left = no_size_left, .tx_size_left = no_size_left,
};

/* Connection management: RDM endpoints have a name and nothing else. */
static int cm_setname(fid_t fid, void *addr, size_t addrlen)
{
	(void)fid; (void)addr; (void)addrlen;
	return -FI_ENOSYS;
}
static int cm_getname(fid_t fid, void *addr, size_t *addrlen)
{
	if (!addrlen)
		return -FI_EINVAL;
	return ret_int(rwofi_ep_getname(OF(struct rw_ep, ep.fid, fid)->h, addr, addrlen));
}
static int cm_getpeer(struct fid_ep *ep, void *addr, size_t *addrlen)
{
	(void)ep; (void)addr; (void)addrlen;
	return -FI_ENOSYS;
}
static int cm_connect(struct fid_ep *ep, const void *addr, const void *param, size_t paramlen)
{
	(void)ep; (void)addr; (void)param; (void)paramlen;
	return -FI_ENOSYS;
}
static int cm_listen(struct fid_pep *pep)
{
	(void)pep;
	return -FI_ENOSYS;
}
static int cm_accept(struct fid_ep *ep, const void *param, size_t paramlen)
{
	(void)ep; (void)param; (void)paramlen;
	return -FI_ENOSYS;
}
static int cm_reject(struct fid_pep *pep, fid_t handle, const void *param, size_t paramlen)
{
	(void)pep; (void)handle; (void)param; (void)paramlen;
	return -FI_ENOSYS;
}
static int cm_shutdown(struct fid_ep *ep, uint64_t flags)
{
	(void)ep; (void)flags;
	return -FI_ENOSYS;
}
static int cm_join(struct fid_ep *ep, const void *addr, uint64_t flags, struct fid_mc **mc, void *context)
{
	(void)ep; (void)addr; (void)flags; (void)mc; (void)context;
	return -FI_ENOSYS;
}
static struct fi_ops_cm ep_cm_ops = {
	.size = sizeof(struct fi_ops_cm), .setname = cm_setname, .getname = cm_getname, .getpeer = cm_getpeer,
	.connect = cm_connect, .listen = cm_listen, .accept = cm_accept, .reject = cm_reject,
	.shutdown = cm_shutdown, .join = cm_join,
};

/* ---- messages ---- */
static ssize_t send_common(struct fid_ep *e, const struct iovec *iov, size_t count, fi_addr_t dest, int tagged,
			   uint64_t tag, int has_data, uint64_t data, uint64_t flags, void *ctx)
{
	if (flags & FI_INJECT) {
		size_t len = 0;
		for (size_t i = 0; i < count; i++)
			len += iov[i].iov_len;
		if (len > RW_INJECT_BYTES)
			return -FI_EMSGSIZE;
	}
	return rwofi_send(EPH(e), iov, count, dest, tagged, tag, has_data, data, flags, ctx);
}
static uint64_t txf(struct fid_ep *e) { return OF(struct rw_ep, ep, e)->tx_flags; }
static uint64_t rxf(struct fid_ep *e) { return OF(struct rw_ep, ep, e)->rx_flags; }
/* A receive's source: ignored (any sender) unless the endpoint was asked for FI_DIRECTED_RECV. */
static fi_addr_t rxsrc(struct fid_ep *e, fi_addr_t src) { return OF(struct rw_ep, ep, e)->directed ? src : FI_ADDR_UNSPEC; }

static ssize_t msg_recv(struct fid_ep *e, void *buf, size_t len, void *desc, fi_addr_t src, void *ctx)
{
	struct iovec iov = { buf, len };
	(void)desc;
	return rwofi_recv(EPH(e), &iov, 1, rxsrc(e, src), 0, 0, 0, rxf(e), ctx);
}
static ssize_t msg_recvv(struct fid_ep *e, const struct iovec *iov, void **desc, size_t count, fi_addr_t src, void *ctx)
{
	(void)desc;
	return rwofi_recv(EPH(e), iov, count, rxsrc(e, src), 0, 0, 0, rxf(e), ctx);
}
static ssize_t msg_recvmsg(struct fid_ep *e, const struct fi_msg *m, uint64_t flags)
{
	if (!m)
		return -FI_EINVAL;
	return rwofi_recv(EPH(e), m->msg_iov, m->iov_count, rxsrc(e, m->addr), 0, 0, 0, flags & ~RW_NO_COMPLETION,
			  m->context);
}
static ssize_t msg_send(struct fid_ep *e, const void *buf, size_t len, void *desc, fi_addr_t dest, void *ctx)
{
	struct iovec iov = { (void *)buf, len };
	(void)desc;
	return send_common(e, &iov, 1, dest, 0, 0, 0, 0, txf(e), ctx);
}
static ssize_t msg_sendv(struct fid_ep *e, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest, void *ctx)
{
	(void)desc;
	return send_common(e, iov, count, dest, 0, 0, 0, 0, txf(e), ctx);
}
static ssize_t msg_sendmsg(struct fid_ep *e, const struct fi_msg *m, uint64_t flags)
{
	if (!m)
		return -FI_EINVAL;
	return send_common(e, m->msg_iov, m->iov_count, m->addr, 0, 0, !!(flags & FI_REMOTE_CQ_DATA), m->data,
			   flags & ~RW_NO_COMPLETION, m->context);
}
static ssize_t msg_inject(struct fid_ep *e, const void *buf, size_t len, fi_addr_t dest)
{
	struct iovec iov = { (void *)buf, len };
	return send_common(e, &iov, 1, dest, 0, 0, 0, 0, FI_INJECT | RW_NO_COMPLETION, NULL);
}
static ssize_t msg_senddata(struct fid_ep *e, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest,
			    void *ctx)
{
	struct iovec iov = { (void *)buf, len };
	(void)desc;
	return send_common(e, &iov, 1, dest, 0, 0, 1, data, txf(e), ctx);
}
static ssize_t msg_injectdata(struct fid_ep *e, const void *buf, size_t len, uint64_t data, fi_addr_t dest)
{
	struct iovec iov = { (void *)buf, len };
	return send_common(e, &iov, 1, dest, 0, 0, 1, data, FI_INJECT | RW_NO_COMPLETION, NULL);
}
static struct fi_ops_msg ep_msg_ops = {
	.size = sizeof(struct fi_ops_msg), .recv = msg_recv, .recvv = msg_recvv, .recvmsg = msg_recvmsg,
	.send = msg_send, .sendv = msg_sendv, .sendmsg = msg_sendmsg, .inject = msg_inject,
	.senddata = msg_senddata, .injectdata = msg_injectdata,
};

/* ---- tagged messages ---- */
static ssize_t t_recv(struct fid_ep *e, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t tag, uint64_t ignore,
		      void *ctx)
{
	struct iovec iov = { buf, len };
	(void)desc;
	return rwofi_recv(EPH(e), &iov, 1, rxsrc(e, src), 1, tag, ignore, rxf(e), ctx);
}
static ssize_t t_recvv(struct fid_ep *e, const struct iovec *iov, void **desc, size_t count, fi_addr_t src, uint64_t tag,
		       uint64_t ignore, void *ctx)
{
	(void)desc;
	return rwofi_recv(EPH(e), iov, count, rxsrc(e, src), 1, tag, ignore, rxf(e), ctx);
}
static ssize_t t_recvmsg(struct fid_ep *e, const struct fi_msg_tagged *m, uint64_t flags)
{
	if (!m)
		return -FI_EINVAL;
	return rwofi_recv(EPH(e), m->msg_iov, m->iov_count, rxsrc(e, m->addr), 1, m->tag, m->ignore,
			  flags & ~RW_NO_COMPLETION, m->context);
}
static ssize_t t_send(struct fid_ep *e, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t tag, void *ctx)
{
	struct iovec iov = { (void *)buf, len };
	(void)desc;
	return send_common(e, &iov, 1, dest, 1, tag, 0, 0, txf(e), ctx);
}
static ssize_t t_sendv(struct fid_ep *e, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest, uint64_t tag,
		       void *ctx)
{
	(void)desc;
	return send_common(e, iov, count, dest, 1, tag, 0, 0, txf(e), ctx);
}
static ssize_t t_sendmsg(struct fid_ep *e, const struct fi_msg_tagged *m, uint64_t flags)
{
	if (!m)
		return -FI_EINVAL;
	return send_common(e, m->msg_iov, m->iov_count, m->addr, 1, m->tag, !!(flags & FI_REMOTE_CQ_DATA), m->data,
			   flags & ~RW_NO_COMPLETION, m->context);
}
static ssize_t t_inject(struct fid_ep *e, const void *buf, size_t len, fi_addr_t dest, uint64_t tag)
{
	struct iovec iov = { (void *)buf, len };
	return send_common(e, &iov, 1, dest, 1, tag, 0, 0, FI_INJECT | RW_NO_COMPLETION, NULL);
}
static ssize_t t_senddata(struct fid_ep *e, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest,
			  uint64_t tag, void *ctx)
{
	struct iovec iov = { (void *)buf, len };
	(void)desc;
	return send_common(e, &iov, 1, dest, 1, tag, 1, data, txf(e), ctx);
}
static ssize_t t_injectdata(struct fid_ep *e, const void *buf, size_t len, uint64_t data, fi_addr_t dest, uint64_t tag)
{
	struct iovec iov = { (void *)buf, len };
	return send_common(e, &iov, 1, dest, 1, tag, 1, data, FI_INJECT | RW_NO_COMPLETION, NULL);
}
static struct fi_ops_tagged ep_tagged_ops = {
	.size = sizeof(struct fi_ops_tagged), .recv = t_recv, .recvv = t_recvv, .recvmsg = t_recvmsg, .send = t_send,
	.sendv = t_sendv, .sendmsg = t_sendmsg, .inject = t_inject, .senddata = t_senddata, .injectdata = t_injectdata,
};

/* ---- RMA: carried out by the target's provider after its checks (src/rma.rs) ---- */
static ssize_t rma_read(struct fid_ep *e, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t addr, uint64_t key,
			void *ctx)
{
	struct iovec iov = { buf, len };
	(void)desc;
	return rwofi_rma(EPH(e), 1, &iov, 1, src, addr, key, 0, 0, txf(e), ctx);
}
static ssize_t rma_readv(struct fid_ep *e, const struct iovec *iov, void **desc, size_t count, fi_addr_t src,
			 uint64_t addr, uint64_t key, void *ctx)
{
	(void)desc;
	return rwofi_rma(EPH(e), 1, iov, count, src, addr, key, 0, 0, txf(e), ctx);
}
static ssize_t rma_readmsg(struct fid_ep *e, const struct fi_msg_rma *m, uint64_t flags)
{
	if (!m || m->rma_iov_count != 1 || !m->rma_iov)
		return -FI_EINVAL;
	return rwofi_rma(EPH(e), 1, m->msg_iov, m->iov_count, m->addr, m->rma_iov[0].addr, m->rma_iov[0].key, 0, 0,
			 flags & ~RW_NO_COMPLETION, m->context);
}
static ssize_t rma_write(struct fid_ep *e, const void *buf, size_t len, void *desc, fi_addr_t dest, uint64_t addr,
			 uint64_t key, void *ctx)
{
	struct iovec iov = { (void *)buf, len };
	(void)desc;
	return rwofi_rma(EPH(e), 0, &iov, 1, dest, addr, key, 0, 0, txf(e), ctx);
}
static ssize_t rma_writev(struct fid_ep *e, const struct iovec *iov, void **desc, size_t count, fi_addr_t dest,
			  uint64_t addr, uint64_t key, void *ctx)
{
	(void)desc;
	return rwofi_rma(EPH(e), 0, iov, count, dest, addr, key, 0, 0, txf(e), ctx);
}
static ssize_t rma_writemsg(struct fid_ep *e, const struct fi_msg_rma *m, uint64_t flags)
{
	if (!m || m->rma_iov_count != 1 || !m->rma_iov)
		return -FI_EINVAL;
	if (flags & FI_INJECT) {
		size_t len = 0;
		for (size_t i = 0; i < m->iov_count; i++)
			len += m->msg_iov[i].iov_len;
		if (len > RW_INJECT_BYTES)
			return -FI_EMSGSIZE;
	}
	return rwofi_rma(EPH(e), 0, m->msg_iov, m->iov_count, m->addr, m->rma_iov[0].addr, m->rma_iov[0].key,
			 !!(flags & FI_REMOTE_CQ_DATA), m->data, flags & ~RW_NO_COMPLETION, m->context);
}
static ssize_t rma_inject(struct fid_ep *e, const void *buf, size_t len, fi_addr_t dest, uint64_t addr, uint64_t key)
{
	struct iovec iov = { (void *)buf, len };
	if (len > RW_INJECT_BYTES)
		return -FI_EMSGSIZE;
	return rwofi_rma(EPH(e), 0, &iov, 1, dest, addr, key, 0, 0, FI_INJECT | RW_NO_COMPLETION, NULL);
}
static ssize_t rma_writedata(struct fid_ep *e, const void *buf, size_t len, void *desc, uint64_t data, fi_addr_t dest,
			     uint64_t addr, uint64_t key, void *ctx)
{
	struct iovec iov = { (void *)buf, len };
	(void)desc;
	return rwofi_rma(EPH(e), 0, &iov, 1, dest, addr, key, 1, data, txf(e), ctx);
}
static ssize_t rma_injectdata(struct fid_ep *e, const void *buf, size_t len, uint64_t data, fi_addr_t dest,
			      uint64_t addr, uint64_t key)
{
	struct iovec iov = { (void *)buf, len };
	if (len > RW_INJECT_BYTES)
		return -FI_EMSGSIZE;
	return rwofi_rma(EPH(e), 0, &iov, 1, dest, addr, key, 1, data, FI_INJECT | RW_NO_COMPLETION, NULL);
}
static struct fi_ops_rma ep_rma_ops = {
	.size = sizeof(struct fi_ops_rma), .read = rma_read, .readv = rma_readv, .readmsg = rma_readmsg,
	.write = rma_write, .writev = rma_writev, .writemsg = rma_writemsg, .inject = rma_inject,
	.writedata = rma_writedata, .injectdata = rma_injectdata,
};

/* ---- atomics: one buffer of elements per call (iov_limit 1 for atomics) ---- */
#define AT(form, buf, count, cmp, res, dest, addr, key, dt, op, flags, ctx) \
	rwofi_atomic(EPH(ep), form, (int)(dt), (int)(op), buf, count, cmp, res, dest, addr, key, flags, ctx)

static ssize_t at_write(struct fid_ep *ep, const void *buf, size_t count, void *desc, fi_addr_t dest, uint64_t addr,
			uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	(void)desc;
	return AT(RW_ATOMIC_WRITE, buf, count, NULL, NULL, dest, addr, key, dt, op, txf(ep), ctx);
}
static ssize_t at_writev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t count, fi_addr_t dest,
			 uint64_t addr, uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	(void)desc;
	if (count != 1 || !iov)
		return -FI_EINVAL;
	return AT(RW_ATOMIC_WRITE, iov[0].addr, iov[0].count, NULL, NULL, dest, addr, key, dt, op, txf(ep), ctx);
}
static ssize_t at_writemsg(struct fid_ep *ep, const struct fi_msg_atomic *m, uint64_t flags)
{
	if (!m || m->iov_count != 1 || m->rma_iov_count != 1)
		return -FI_EINVAL;
	return AT(RW_ATOMIC_WRITE, m->msg_iov[0].addr, m->msg_iov[0].count, NULL, NULL, m->addr, m->rma_iov[0].addr,
		  m->rma_iov[0].key, m->datatype, m->op, flags & ~RW_NO_COMPLETION, m->context);
}
static ssize_t at_inject(struct fid_ep *ep, const void *buf, size_t count, fi_addr_t dest, uint64_t addr, uint64_t key,
			 enum fi_datatype dt, enum fi_op op)
{
	return AT(RW_ATOMIC_WRITE, buf, count, NULL, NULL, dest, addr, key, dt, op, FI_INJECT | RW_NO_COMPLETION, NULL);
}
static ssize_t at_readwrite(struct fid_ep *ep, const void *buf, size_t count, void *desc, void *result,
			    void *result_desc, fi_addr_t dest, uint64_t addr, uint64_t key, enum fi_datatype dt,
			    enum fi_op op, void *ctx)
{
	(void)desc; (void)result_desc;
	return AT(RW_ATOMIC_FETCH, buf, count, NULL, result, dest, addr, key, dt, op, txf(ep), ctx);
}
static ssize_t at_readwritev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t count,
			     struct fi_ioc *resultv, void **result_desc, size_t result_count, fi_addr_t dest,
			     uint64_t addr, uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	(void)desc; (void)result_desc;
	if (count != 1 || result_count != 1 || !iov || !resultv || resultv[0].count < iov[0].count)
		return -FI_EINVAL;
	return AT(RW_ATOMIC_FETCH, iov[0].addr, iov[0].count, NULL, resultv[0].addr, dest, addr, key, dt, op, txf(ep),
		  ctx);
}
static ssize_t at_readwritemsg(struct fid_ep *ep, const struct fi_msg_atomic *m, struct fi_ioc *resultv,
			       void **result_desc, size_t result_count, uint64_t flags)
{
	(void)result_desc;
	if (!m || m->iov_count != 1 || m->rma_iov_count != 1 || result_count != 1 || !resultv ||
	    resultv[0].count < m->msg_iov[0].count)
		return -FI_EINVAL;
	return AT(RW_ATOMIC_FETCH, m->msg_iov[0].addr, m->msg_iov[0].count, NULL, resultv[0].addr, m->addr,
		  m->rma_iov[0].addr, m->rma_iov[0].key, m->datatype, m->op, flags & ~RW_NO_COMPLETION, m->context);
}
static ssize_t at_compwrite(struct fid_ep *ep, const void *buf, size_t count, void *desc, const void *compare,
			    void *compare_desc, void *result, void *result_desc, fi_addr_t dest, uint64_t addr,
			    uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	(void)desc; (void)compare_desc; (void)result_desc;
	return AT(RW_ATOMIC_COMPARE, buf, count, compare, result, dest, addr, key, dt, op, txf(ep), ctx);
}
static ssize_t at_compwritev(struct fid_ep *ep, const struct fi_ioc *iov, void **desc, size_t count,
			     const struct fi_ioc *comparev, void **compare_desc, size_t compare_count,
			     struct fi_ioc *resultv, void **result_desc, size_t result_count, fi_addr_t dest,
			     uint64_t addr, uint64_t key, enum fi_datatype dt, enum fi_op op, void *ctx)
{
	(void)desc; (void)compare_desc; (void)result_desc;
	if (count != 1 || compare_count != 1 || result_count != 1 || !iov || !comparev || !resultv ||
	    comparev[0].count != iov[0].count || resultv[0].count < iov[0].count)
		return -FI_EINVAL;
	return AT(RW_ATOMIC_COMPARE, iov[0].addr, iov[0].count, comparev[0].addr, resultv[0].addr, dest, addr, key, dt,
		  op, txf(ep), ctx);
}
static ssize_t at_compwritemsg(struct fid_ep *ep, const struct fi_msg_atomic *m, const struct fi_ioc *comparev,
			       void **compare_desc, size_t compare_count, struct fi_ioc *resultv, void **result_desc,
			       size_t result_count, uint64_t flags)
{
	(void)compare_desc; (void)result_desc;
	if (!m || m->iov_count != 1 || m->rma_iov_count != 1 || compare_count != 1 || result_count != 1 || !comparev ||
	    !resultv || comparev[0].count != m->msg_iov[0].count || resultv[0].count < m->msg_iov[0].count)
		return -FI_EINVAL;
	return AT(RW_ATOMIC_COMPARE, m->msg_iov[0].addr, m->msg_iov[0].count, comparev[0].addr, resultv[0].addr,
		  m->addr, m->rma_iov[0].addr, m->rma_iov[0].key, m->datatype, m->op, flags & ~RW_NO_COMPLETION, m->context);
}
static int at_valid(int form, enum fi_datatype dt, enum fi_op op, size_t *count)
{
	return ret_int(rwofi_atomic_valid((int)dt, (int)op, form, count));
}
static int at_writevalid(struct fid_ep *ep, enum fi_datatype dt, enum fi_op op, size_t *count)
{
	(void)ep;
	return at_valid(RW_ATOMIC_WRITE, dt, op, count);
}
static int at_readwritevalid(struct fid_ep *ep, enum fi_datatype dt, enum fi_op op, size_t *count)
{
	(void)ep;
	return at_valid(RW_ATOMIC_FETCH, dt, op, count);
}
static int at_compwritevalid(struct fid_ep *ep, enum fi_datatype dt, enum fi_op op, size_t *count)
{
	(void)ep;
	return at_valid(RW_ATOMIC_COMPARE, dt, op, count);
}
static struct fi_ops_atomic ep_atomic_ops = {
	.size = sizeof(struct fi_ops_atomic), .write = at_write, .writev = at_writev, .writemsg = at_writemsg,
	.inject = at_inject, .readwrite = at_readwrite, .readwritev = at_readwritev,
	.readwritemsg = at_readwritemsg, .compwrite = at_compwrite, .compwritev = at_compwritev,
	.compwritemsg = at_compwritemsg, .writevalid = at_writevalid, .readwritevalid = at_readwritevalid,
	.compwritevalid = at_compwritevalid,
};

int rw_ep_open(struct fid_domain *d, struct fi_info *info, struct fid_ep **out, void *context)
{
	struct rw_ep *ep;
	int64_t r;
	(void)d;
	if (!out)
		return -FI_EINVAL;
	if (info && info->ep_attr && info->ep_attr->type != FI_EP_RDM && info->ep_attr->type != FI_EP_UNSPEC)
		return -FI_EINVAL;
	ep = calloc(1, sizeof(*ep));
	if (!ep)
		return -FI_ENOMEM;
	r = rwofi_ep_open(&ep->h);
	if (r < 0) {
		free(ep);
		return (int)r;
	}
	if (info && info->tx_attr)
		ep->tx_flags = info->tx_attr->op_flags;
	if (info && info->rx_attr)
		ep->rx_flags = info->rx_attr->op_flags;
	ep->directed = info && ((info->caps | (info->rx_attr ? info->rx_attr->caps : 0)) & FI_DIRECTED_RECV);
	ep->ep.fid.fclass = FI_CLASS_EP;
	ep->ep.fid.context = context;
	ep->ep.fid.ops = &ep_fid_ops;
	ep->ep.ops = &ep_ops;
	ep->ep.cm = &ep_cm_ops;
	ep->ep.msg = &ep_msg_ops;
	ep->ep.tagged = &ep_tagged_ops;
	ep->ep.rma = &ep_rma_ops;
	ep->ep.atomic = &ep_atomic_ops;
	ep->ep.collective = NULL; /* FI_COLLECTIVE is not offered */
	*out = &ep->ep;
	return 0;
}
