// SPDX-License-Identifier: GPL-2.0
/*
 * ibemu's fault notices in the kernel, second half: notice.c has written the onward notice
 * over the frame (bitmap, TID, hop fields, both paths cleared) and tail-calls this program
 * with skb->cb[1] = device, skb->cb[3..4] = the ports to send it on (bits 0..63). It seals
 * the frame (ICRC, VCRC, InitialPath[1] = 0) once, then for each port patches
 * InitialPath[1] and both CRCs (sma_ndelta: the CRCs of a fixed-length frame change by a
 * constant per value of one byte), sets the cable's Ethernet addresses and sends a clone
 * (bpf_clone_redirect). A port whose cable is down is passed over (the wire would drop it).
 * The frame itself is consumed. See ibemu/kernel/notice.py.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "frame.h"

#define IP1_AT (MAD + 129)
#define MAX_PORT 63

struct delta {
	__u32 icrc, vcrc;
};

struct ibemu_map sma_out SEC("maps") = { BPF_MAP_TYPE_HASH, 4, sizeof(struct out_val), 65536, 0 };
struct ibemu_map sma_crc SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 16384, 1, 0 };
struct ibemu_map sma_ndelta SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct delta), 256, 0 };

#include "crc.h"

SEC("tc")
int ibemu_notice_tx(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u8 *p = data;
	__u32 zero = 0, dev = skb->cb[1], ic, vc, port;
	__u64 want = skb->cb[3] | ((__u64)skb->cb[4] << 32);
	__u32 *t;

	if (skb->len != FRAME_LEN || data + FRAME_LEN > end)
		return TC_ACT_SHOT;
	t = bpf_map_lookup_elem(&sma_crc, &zero);
	if (!t)
		return TC_ACT_SHOT;
	p[IP1_AT] = 0;
	ic = icrc(p, end, t);
	p[ICRC_AT] = ic;
	p[ICRC_AT + 1] = ic >> 8;
	p[ICRC_AT + 2] = ic >> 16;
	p[ICRC_AT + 3] = ic >> 24;
	vc = vcrc(p, end, t);
#pragma clang loop unroll(disable)
	for (port = 1; port <= MAX_PORT; port++) {
		struct out_val *out;
		struct delta *d;
		__u32 c, key, dkey;
		__u8 b[6];

		if (!((want >> port) & 1))
			continue;
		key = (dev << 8) | port;
		dkey = port;
		out = bpf_map_lookup_elem(&sma_out, &key);
		d = bpf_map_lookup_elem(&sma_ndelta, &dkey);
		if (!out || !d || !out->up)
			continue;
		b[0] = port;
		bpf_skb_store_bytes(skb, IP1_AT, b, 1, 0);
		c = ic ^ d->icrc;
		b[0] = c;
		b[1] = c >> 8;
		b[2] = c >> 16;
		b[3] = c >> 24;
		bpf_skb_store_bytes(skb, ICRC_AT, b, 4, 0);
		c = vc ^ d->vcrc;
		b[0] = c;
		b[1] = c >> 8;
		bpf_skb_store_bytes(skb, VCRC_AT, b, 2, 0);
		bpf_skb_store_bytes(skb, 0, out->peer, 6, 0);
		bpf_skb_store_bytes(skb, 6, out->own, 6, 0);
		bpf_clone_redirect(skb, out->ifindex, 0);
	}
	return TC_ACT_SHOT;
}

char _license[] SEC("license") = "GPL";
