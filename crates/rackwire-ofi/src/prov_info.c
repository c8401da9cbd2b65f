/*
 * fi_getinfo's answer: one fi_info for an RDM endpoint, with the attributes and limits the
 * provider really has, or -FI_ENODATA when the hints ask for what it cannot do (another
 * endpoint type, capabilities or modes it lacks, larger limits) or the
 * process is not configured to join a fabric (no RACKWIRE_MH, RACKWIRE_CONFIG nor
 * /etc/rackwire/rackwire.toml).
 */
#include "provider.h"

/* A tag format of 64 one-bit fields: all 64 bits matched (libfabric's providers call it
 * FI_TAG_GENERIC; the public headers do not name it). */
#define RW_TAG_FORMAT 0xAAAAAAAAAAAAAAAAULL

/* Whether the application can use RMA keys and addresses as this provider gives them. */
static int rma_mr_ok(const struct fi_info *hints, uint32_t version)
{
	int mode;
	if (!hints || !hints->domain_attr)
		return 1;
	mode = hints->domain_attr->mr_mode;
	if (FI_VERSION_LT(version, FI_VERSION(1, 5)) || mode == FI_MR_BASIC)
		return mode != FI_MR_SCALABLE;
	return (mode & RW_RMA_MR_MODE) == RW_RMA_MR_MODE;
}

/* Whether `hints` asks only for what the provider does. */
static int hints_fit(const struct fi_info *hints)
{
	const struct fi_ep_attr *ep = hints->ep_attr;
	const struct fi_domain_attr *dom = hints->domain_attr;
	const struct fi_fabric_attr *fab = hints->fabric_attr;
	const struct fi_tx_attr *tx = hints->tx_attr;
	const struct fi_rx_attr *rx = hints->rx_attr;

	if (hints->caps & ~(uint64_t)RW_CAPS)
		return 0;
	if (hints->addr_format != FI_FORMAT_UNSPEC)
		return 0;
	if ((hints->dest_addr && hints->dest_addrlen != RW_ADDR_BYTES) ||
	    (hints->src_addr && hints->src_addrlen != RW_ADDR_BYTES))
		return 0;
	if (ep) {
		if (ep->type != FI_EP_UNSPEC && ep->type != FI_EP_RDM)
			return 0;
		if (ep->max_msg_size > RW_MSG_BYTES_MAX || ep->tx_ctx_cnt > 1 || ep->rx_ctx_cnt > 1)
			return 0;
		if (ep->auth_key_size)
			return 0;
	}
	/* RMA and atomics need virtual addresses and the provider's keys. */
	if (hints->caps & (FI_RMA | FI_ATOMIC) && !rma_mr_ok(hints, FI_VERSION(1, 17)))
		return 0;
	if (dom) {
		if (dom->name && strcmp(dom->name, RW_PROV_NAME))
			return 0;
		if (dom->caps & ~(uint64_t)(FI_LOCAL_COMM | FI_REMOTE_COMM))
			return 0;
		if (dom->av_type != FI_AV_UNSPEC && dom->av_type != FI_AV_MAP && dom->av_type != FI_AV_TABLE)
			return 0;
		if (dom->mr_mode & (FI_MR_BASIC | FI_MR_SCALABLE) && (dom->mr_mode & ~(FI_MR_BASIC | FI_MR_SCALABLE)))
			return 0;
		if (dom->cq_data_size > 8 || dom->auth_key_size)
			return 0;
	}
	if (fab && fab->name && strcmp(fab->name, RW_PROV_NAME))
		return 0;
	if (tx) {
		if (tx->caps & ~(uint64_t)RW_CAPS || tx->inject_size > RW_INJECT_BYTES || tx->size > RW_TX_SIZE ||
		    tx->iov_limit > RW_IOV_LIMIT || tx->rma_iov_limit > 1)
			return 0;
		if (tx->msg_order & ~(uint64_t)RW_ORDER)
			return 0;
	}
	if (rx) {
		if (rx->caps & ~(uint64_t)RW_CAPS || rx->size > RW_RX_SIZE || rx->iov_limit > RW_IOV_LIMIT ||
		    rx->total_buffered_recv > RW_BUFFERED_RECV)
			return 0;
		if (rx->msg_order & ~(uint64_t)RW_ORDER)
			return 0;
	}
	return 1;
}

int rw_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags, const struct fi_info *hints,
	       struct fi_info **out)
{
	struct fi_info *fi;
	uint64_t caps;

	(void)node; (void)service;
	*out = NULL;
	if (!rwofi_configured())
		return -FI_ENODATA;
	/* Addresses are node ids and endpoint numbers, not hosts and ports: a destination given
	 * by node and service cannot be resolved; a source one names nothing to choose (the
	 * process has one node, endpoints get their numbers when opened), so it is not used. */
	if (!(flags & FI_SOURCE) && node)
		return -FI_ENODATA;
	if (hints && !hints_fit(hints))
		return -FI_ENODATA;

	fi = fi_dupinfo(NULL);
	if (!fi)
		return -FI_ENOMEM;
	/* What was asked for, with the modifiers and secondary capabilities that come with it;
	 * everything without hints. */
	caps = hints && hints->caps ? hints->caps | RW_OPTIONAL_CAPS : RW_CAPS;
	/* Without RMA keys the application can use, no RMA: leave it out unless asked for. */
	if (!rma_mr_ok(hints, version))
		caps &= ~(uint64_t)(FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE);
	fi->caps = caps;
	fi->mode = 0;
	fi->addr_format = FI_FORMAT_UNSPEC;
	fi->src_addr = malloc(RW_ADDR_BYTES);
	if (!fi->src_addr)
		goto nomem;
	if (hints && hints->src_addr) {
		memcpy(fi->src_addr, hints->src_addr, RW_ADDR_BYTES);
	} else {
		int64_t r = rwofi_src_addr(fi->src_addr);
		if (r < 0) {
			fi_freeinfo(fi);
			return (int)r;
		}
	}
	fi->src_addrlen = RW_ADDR_BYTES;
	if (hints && hints->dest_addr) {
		fi->dest_addr = malloc(RW_ADDR_BYTES);
		if (!fi->dest_addr)
			goto nomem;
		memcpy(fi->dest_addr, hints->dest_addr, RW_ADDR_BYTES);
		fi->dest_addrlen = RW_ADDR_BYTES;
	}

	fi->ep_attr->type = FI_EP_RDM;
	fi->ep_attr->protocol = FI_PROTO_UNSPEC;
	fi->ep_attr->max_msg_size = RW_MSG_BYTES_MAX;
	/* Every one of a tag's 64 bits is matched (with ignore bits): any format the application
	 * asks for fits. */
	fi->ep_attr->mem_tag_format = hints && hints->ep_attr && hints->ep_attr->mem_tag_format
					      ? hints->ep_attr->mem_tag_format
					      : RW_TAG_FORMAT;
	fi->ep_attr->max_order_raw_size = RW_MSG_BYTES_MAX;
	fi->ep_attr->max_order_war_size = RW_MSG_BYTES_MAX;
	fi->ep_attr->max_order_waw_size = RW_MSG_BYTES_MAX;
	fi->ep_attr->tx_ctx_cnt = 1;
	fi->ep_attr->rx_ctx_cnt = 1;

	fi->tx_attr->caps = caps & RW_TX_CAPS;
	fi->tx_attr->mode = 0;
	fi->tx_attr->op_flags = hints && hints->tx_attr ? hints->tx_attr->op_flags : 0;
	fi->tx_attr->msg_order = RW_ORDER;
	fi->tx_attr->comp_order = FI_ORDER_NONE;
	fi->tx_attr->inject_size = RW_INJECT_BYTES;
	fi->tx_attr->size = RW_TX_SIZE;
	fi->tx_attr->iov_limit = RW_IOV_LIMIT;
	fi->tx_attr->rma_iov_limit = caps & (FI_RMA | FI_ATOMIC) ? 1 : 0;

	fi->rx_attr->caps = caps & RW_RX_CAPS;
	fi->rx_attr->mode = 0;
	fi->rx_attr->op_flags = hints && hints->rx_attr ? hints->rx_attr->op_flags : 0;
	fi->rx_attr->msg_order = RW_ORDER;
	fi->rx_attr->comp_order = FI_ORDER_NONE;
	fi->rx_attr->total_buffered_recv = RW_BUFFERED_RECV;
	fi->rx_attr->size = RW_RX_SIZE;
	fi->rx_attr->iov_limit = RW_IOV_LIMIT;

	fi->domain_attr->name = strdup(RW_PROV_NAME);
	if (!fi->domain_attr->name)
		goto nomem;
	fi->domain_attr->threading = hints && hints->domain_attr && hints->domain_attr->threading
					     ? hints->domain_attr->threading
					     : FI_THREAD_SAFE;
	/* Manual progress unless automatic is asked for: then a thread of the provider's makes
	 * progress too (see the engine's `auto_progress`). */
	fi->domain_attr->control_progress =
		hints && hints->domain_attr && hints->domain_attr->control_progress == FI_PROGRESS_AUTO
			? FI_PROGRESS_AUTO
			: FI_PROGRESS_MANUAL;
	fi->domain_attr->data_progress =
		hints && hints->domain_attr && hints->domain_attr->data_progress == FI_PROGRESS_AUTO
			? FI_PROGRESS_AUTO
			: FI_PROGRESS_MANUAL;
	fi->domain_attr->resource_mgmt = FI_RM_ENABLED;
	fi->domain_attr->av_type = hints && hints->domain_attr ? hints->domain_attr->av_type : FI_AV_UNSPEC;
	/* Local buffers need no registering (data is copied in and out of them); RMA targets
	 * are named by virtual address under the provider's key. */
	fi->domain_attr->mr_mode = caps & (FI_RMA | FI_ATOMIC) ? RW_RMA_MR_MODE : 0;
	/* FI_MR_BASIC (the 1.0 name of virtual addresses and provider keys) is answered in kind. */
	if (FI_VERSION_LT(version, FI_VERSION(1, 5)) ||
	    (hints && hints->domain_attr && hints->domain_attr->mr_mode == FI_MR_BASIC))
		fi->domain_attr->mr_mode = FI_MR_BASIC;
	fi->domain_attr->mr_key_size = 8;
	fi->domain_attr->cq_data_size = 8;
	fi->domain_attr->cq_cnt = RW_OBJECTS_MAX;
	fi->domain_attr->ep_cnt = RW_OBJECTS_MAX;
	fi->domain_attr->tx_ctx_cnt = RW_OBJECTS_MAX;
	fi->domain_attr->rx_ctx_cnt = RW_OBJECTS_MAX;
	fi->domain_attr->max_ep_tx_ctx = 1;
	fi->domain_attr->max_ep_rx_ctx = 1;
	fi->domain_attr->cntr_cnt = RW_OBJECTS_MAX;
	fi->domain_attr->mr_iov_limit = 1;
	fi->domain_attr->mr_cnt = RW_OBJECTS_MAX;
	fi->domain_attr->caps = FI_LOCAL_COMM | FI_REMOTE_COMM;
	fi->domain_attr->max_err_data = 0;

	fi->fabric_attr->name = strdup(RW_PROV_NAME);
	if (!fi->fabric_attr->name)
		goto nomem;
	fi->fabric_attr->prov_version = RW_PROV_VERSION;
	*out = fi;
	return 0;
nomem:
	fi_freeinfo(fi);
	return -FI_ENOMEM;
}
