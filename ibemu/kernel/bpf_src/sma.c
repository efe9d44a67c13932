// SPDX-License-Identifier: GPL-2.0
/*
 * ibemu's device firmware hot path: the subnet management agent (SMA) of every emulated
 * switch and CA port, as one direct-action tc classifier (ingress). See ibemu/kernel/sma.py
 * for the design, the maps and every deviation; the Python agents (ibemu/agents) are the
 * reference this program is proven equal to (tests/integration/test_sma_bpf.py).
 *
 * Per frame: a canonical management packet (0x88B5, 304 bytes, VL15, LRH+BTH, PktLen 72,
 * UD SEND Only without pad, to QP0) of a port the loader registered, with the node enabled
 * and its VCRC and ICRC correct (checked only where it answers, relays or forwards: a frame it
 * hands up is checked by its receiver), is
 *   - relayed, at an intermediate hop of a directed-route SMP (switches only, C14-9/C14-13),
 *     its CRCs patched for the bytes it changes (sma_rdelta), not recomputed;
 *   - walked, when it is relayed outward and every later hop would relay it and the last
 *     answer it here too: carried through the maps to its last hop and answered back out of
 *     its ingress port in this one run (walk(), below; ibemu/kernel/sma.py, "walks");
 *   - forwarded by the LFT, when it is LID-routed to another node (switches only: the LFT
 *     classifier leaves VL15 to this program, which gives it each cable's MAC addresses);
 *   - answered, when it is a SubnGet of NodeDescription, NodeInfo, SwitchInfo, PortInfo,
 *     P_KeyTable or LinearForwardingTable, or a SubnSet of LinearForwardingTable, reaching
 *     its SMA directed-route (last hop, permissive DLID) or LID-routed (DLID = the port's
 *     LID), and passing the M_Key check trivially (the port has no M_Key, or the SMP carries
 *     it, and no lease countdown runs): the attribute comes from the maps the Python agent
 *     publishes;
 * and everything else returns TC_ACT_UNSPEC: up the stack to the agent's packet socket,
 * unchanged. Built with: clang -O2 -g0 -target bpf -I/usr/include -c sma.c
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "frame.h"

#define ATTR_NODE_DESC 0x0010
#define ATTR_NODE_INFO 0x0011
#define ATTR_SWITCH_INFO 0x0012
#define ATTR_PORT_INFO 0x0015
#define ATTR_PKEY_TABLE 0x0016
#define ATTR_LFT 0x0019
#define ATTR_FAULT_NOTICE 0xFF32
#define METHOD_TRAP 5
/* Not an attribute (IDs are 16 bits): the agent's M_Key state of a port (DeviceAgent.mkey_guard):
 * M_Key (8 bytes, big-endian), protect bits, 1 while a lease countdown runs. */
#define ATTR_MKEY_GUARD 0x10015

#define LFT_BLOCKS_MAX 768
#define PHYS_LINK_UP 5
#define STATE_DOWN 1
#define FLAG_ENABLED 1
#define PASS TC_ACT_UNSPEC

struct port_val {	/* sma_ports: receiving port's MAC -> */
	__u32 ifindex, dev, port, flags;
};
struct dev_val {	/* sma_dev: dev -> */
	__u32 lft_base;		/* first sma_lft index of the switch's raw LFT */
	__u16 lft_blocks;	/* 0: LFT Get/Set stay with the agent */
	__u8 is_switch, num_ports;
};
struct attr_key {	/* sma_attr: (dev, attribute, modifier) -> 64 data bytes */
	__u32 dev, attr, mod;
};
struct lft_block {
	__u8 b[64];
};

struct ibemu_map sma_ports SEC("maps") = { BPF_MAP_TYPE_HASH, 8, sizeof(struct port_val), 65536, 0 };
struct ibemu_map sma_out SEC("maps") = { BPF_MAP_TYPE_HASH, 4, sizeof(struct out_val), 65536, 0 };
struct ibemu_map sma_dev SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct dev_val), 16384, 0 };
struct ibemu_map sma_attr SEC("maps") = { BPF_MAP_TYPE_HASH, sizeof(struct attr_key), 64, 131072, 0 };
/* The frames a walk (below) moved across a port's cable without the cable: sma_out's slot ->
 * frames sent, frames received (each FRAME_LEN bytes), added to the interface's own totals by
 * the agent host (PortCounters.follow_link). */
struct vcnt {
	__u64 tx, rx;
};
#define VCNT_SLOTS 65536
struct ibemu_map sma_vcnt SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct vcnt), VCNT_SLOTS, 0 };
struct ibemu_map sma_crc SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 16384, 1, 0 };
/* What a relay's change of one byte does to the CRCs (ibemu/kernel/sma.py, relay_deltas):
 * key RD_SLOTS-slot << 8 | old ^ new -> (ICRC, VCRC) to XOR in, the VCRC's part taking in
 * the ICRC's change (the CRCs of a fixed-length frame are linear in its bytes). */
struct delta {
	__u32 icrc, vcrc;
};
#define RD_SLID 0		/* LRH + 6, LRH + 7: slots 0, 1 */
#define RD_HP 2			/* MAD + 6 */
#define RD_RP 3			/* RETURN_PATH + i: slot 3 + i */
#define RD_SLOTS 67
struct ibemu_map sma_rdelta SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct delta), RD_SLOTS << 8, 0 };
#define WALK_MAX 8
/* Per CPU, off the 512-byte stack: an LFT Set's old block and the block the forwarding map
 * takes; a walk's cable ends (their sma_vcnt slots, two a hop). */
struct lft_scratch {
	struct lft_block prev, eff;
	__u32 slots[2 * WALK_MAX];
};
struct ibemu_map sma_scratch SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, sizeof(struct lft_scratch), 1, 0 };
/* Raw LFT blocks of every switch (what LinearForwardingTable Get returns), mmapped by the
 * Python agents as their Lft's storage. The loader sizes it. */
struct ibemu_map sma_lft SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 64, LFT_BLOCKS_MAX, BPF_F_MMAPABLE };
/* dev -> the switch's forwarding map (ibemu_lft, ibemu/kernel/lft_map.py). The loader
 * creates it (a map of maps needs its inner map's shape). */
struct ibemu_map sma_fwd SEC("maps") = { BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, 4, 16384, 0 };
/* What the kernel did that the agents would have logged: one record per LFT block Set that
 * changed the block, read by the agent host (ibemu/kernel/sma.py, SmaLog). */
/* [0]: the fault notice program (notice.c), tail-called for a FaultNotice checked here;
 * [1]: its second half (notice_tx.c) */
struct ibemu_map sma_tail SEC("maps") = { BPF_MAP_TYPE_PROG_ARRAY, 4, 4, 2, 0 };
struct ibemu_map sma_log SEC("maps") = { BPF_MAP_TYPE_RINGBUF, 0, 0, 1 << 18, 0 };
struct lft_rec {	/* sma_log record */
	__u64 t_ns;		/* bpf_ktime_get_ns(): CLOCK_MONOTONIC when the forwarding map had it */
	__u32 dev;
	__u16 block;
	__u16 changed;		/* entries changed, 0 < LID <= LinearFDBTop (as Lft.set_block) */
};

static __always_inline __u32 be16(const __u8 *p)
{
	return ((__u32)p[0] << 8) | p[1];
}

static __always_inline __u32 be32(const __u8 *p)
{
	return ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
}

/* The ICRC and VCRC (crc.h, shared with the fault notice programs). */
#include "crc.h"

static __always_inline __u32 le32_at(const __u8 *p)
{
	return p[0] | ((__u32)p[1] << 8) | ((__u32)p[2] << 16) | ((__u32)p[3] << 24);
}

/* The strict receive check (VCRC, then ICRC), made only where the program answers, relays
 * or forwards: a frame it hands up unchanged is checked by the agent (DeviceAgent.receive,
 * which counts a failure) or by ibemu's SM on its own port (sm/directport.py). */
static __always_inline int crc_ok(__u8 *p, void *end, const __u32 *t)
{
	return vcrc(p, end, t) == (p[VCRC_AT] | ((__u32)p[VCRC_AT + 1] << 8)) &&
	       icrc(p, end, t) == le32_at(p + ICRC_AT);
}

/* One byte of a checked frame goes from old to new: the CRCs' change (sma_rdelta); 0 if the
 * table has no entry (not reached: an array's valid index). */
static __always_inline int crc_delta(__u32 slot, __u32 old, __u32 new, __u32 *ic, __u32 *vc)
{
	__u32 key = (slot << 8) | ((old ^ new) & 0xff);
	struct delta *d;

	if (key >= (RD_SLOTS << 8))
		return 0;
	if (!(key & 0xff))
		return 1;
	d = bpf_map_lookup_elem(&sma_rdelta, &key);
	if (!d)
		return 0;
	*ic ^= d->icrc;
	*vc ^= d->vcrc;
	return 1;
}

/* A frame byte at a variable offset (checked again: the verifier wants it), -1 if beyond. */
static __always_inline int byte_at(__u8 *p, void *end, __u32 off)
{
	__u8 *q = p + (off & 0x1ff);

	if ((void *)(q + 1) > end)
		return -1;
	return *q;
}

static __always_inline void set_byte_at(__u8 *p, void *end, __u32 off, __u8 v)
{
	__u8 *q = p + (off & 0x1ff);

	if ((void *)(q + 1) <= end)
		*q = v;
}

static __always_inline __u8 *image(__u32 dev, __u32 attr, __u32 mod)
{
	struct attr_key k = { .dev = dev, .attr = attr, .mod = mod };

	return bpf_map_lookup_elem(&sma_attr, &k);
}

/* The port's PortInfo as the agent last published it: its link is up (LinkUp). */
static __always_inline int port_link_up(__u32 dev, __u32 port)
{
	__u8 *pi = image(dev, ATTR_PORT_INFO, port);

	return pi && (pi[33] >> 4) == PHYS_LINK_UP;
}

/* The port the switch's LFT sends ``lid`` to, as Lft.lookup and Forwarder.route(vl15) decide
 * it (0 < lid <= LinearFDBTop, a port that exists, its link up and not Down); 0: none. */
static __always_inline __u32 lft_route(__u32 dev, struct dev_val *dv, __u32 lid)
{
	__u8 *si = image(dev, ATTR_SWITCH_INFO, 0), *epi;
	struct lft_block *raw;
	__u32 idx, e;

	if (!si || dv->lft_blocks == 0 || lid == 0 || lid > be16(si + 6) || (lid >> 6) >= dv->lft_blocks)
		return 0;
	idx = dv->lft_base + (lid >> 6);
	raw = bpf_map_lookup_elem(&sma_lft, &idx);
	if (!raw)
		return 0;
	e = raw->b[lid & 63];
	if (e == 0 || e == 0xff || e > dv->num_ports)
		return 0;
	epi = image(dev, ATTR_PORT_INFO, e);
	if (!epi || (epi[33] >> 4) != PHYS_LINK_UP || (epi[32] & 0x0f) == STATE_DOWN)
		return 0;
	return e;
}

static __always_inline int owns_lid(__u32 lid, __u32 lmc, __u32 dlid)
{
	return lid != 0 && (dlid >> lmc) == (lid >> lmc);
}

/* The SMPs an SMA answers in the kernel, whichever it is (the agent decides everything else):
 * a Get, or a Set of LinearForwardingTable, of class version 1. */
static __always_inline int kernel_method(const __u8 *p)
{
	__u32 method = p[MAD + 3];

	return p[MAD] == 1 && p[MAD + 2] == 1 && (method == 1 || (method == 2 && be16(p + MAD + 16) == ATTR_LFT));
}

/* One of those that also passes this SMA's M_Key check without a decision: a key the SMP does
 * not carry, or a lease countdown, and the agent decides (it answers, hides the key, or drops
 * and counts: ibemu/agents/port.py). */
static __always_inline int answerable(const __u8 *p, struct dev_val *dv, __u32 dev, __u32 ingress)
{
	__u8 *g;

	if (!kernel_method(p))
		return 0;
	g = image(dev, ATTR_MKEY_GUARD, dv->is_switch ? 0 : ingress);
	if (g) {
		__u64 have, sent;

		__builtin_memcpy(&have, g, 8);
		__builtin_memcpy(&sent, p + MAD + 24, 8);
		if (g[9] || (have && have != sent))
			return 0;
	}
	return 1;
}

/* The attribute's 64 data bytes as dev's SMA answers an answerable SMP arriving on ingress (an
 * LFT Set applied first: the switch's raw block, its forwarding map, the log), or 0: the agent
 * takes it. *patch = 28: LocalPortNum is to be the ingress port. */
static __always_inline __u8 *attr_image(__u8 *p, struct dev_val *dv, __u32 dev, __u32 ingress, int *patch)
{
	__u32 method = p[MAD + 3], attr = be16(p + MAD + 16), mod = be32(p + MAD + 20), key;

	switch (attr) {
	case ATTR_NODE_DESC:
	case ATTR_SWITCH_INFO:
		return image(dev, attr, 0);
	case ATTR_NODE_INFO:
		return image(dev, attr, ingress);
	case ATTR_PORT_INFO:
		key = mod & 0x7fffffff;
		if (key > 0xff)
			return 0;
		if (!dv->is_switch && key == 0)
			key = ingress;
		*patch = 28;	/* LocalPortNum */
		return image(dev, attr, key);
	case ATTR_PKEY_TABLE:
		key = dv->is_switch ? mod : (ingress << 16) | (mod & 0xffff);
		return image(dev, attr, key);
	case ATTR_LFT: {
		__u32 idx, top, i, changed, zero = 0;
		struct lft_block *raw;
		struct lft_scratch *sc;
		__u8 *si;
		void *fwd;

		if (dv->lft_blocks == 0 || mod >= dv->lft_blocks || mod >= LFT_BLOCKS_MAX)
			return 0;
		idx = dv->lft_base + mod;
		raw = bpf_map_lookup_elem(&sma_lft, &idx);
		if (!raw)
			return 0;
#ifdef NO_LFTSET
		if (method == 2)
			return 0;
#endif
		if (method == 2) {
			si = image(dev, ATTR_SWITCH_INFO, 0);
			fwd = bpf_map_lookup_elem(&sma_fwd, &dev);
			sc = bpf_map_lookup_elem(&sma_scratch, &zero);
			if (!si || !fwd || !sc)
				return 0;
			top = be16(si + 6);
			sc->prev = *raw;
			__builtin_memcpy(raw->b, p + DATA, 64);
			changed = 0;
			/* what the forwarding plane takes: entries up to LinearFDBTop */
#pragma clang loop unroll(disable)
			for (i = 0; i < 64; i++) {
				/* branch-free (a branch per entry would multiply the
				 * verifier's states): keep v if 0 < lid <= top, v != 0xFF */
				__s64 l = (__s64)((mod << 6) + i);
				__u64 v = raw->b[i];
				__u64 keep = (__u64)(~(((__s64)top - l) | (l - 1)) >> 63) & 1;
				__u64 routed = ((v ^ 0xff) + 0xff) >> 8;

				sc->eff.b[i] = v & (0 - (keep & routed));
				/* what the agent's Lft.set_block returns: raw entries that
				 * differ, 0 < lid <= LinearFDBTop */
				changed += keep & ((((__u64)(sc->prev.b[i] ^ v)) + 0xff) >> 8);
			}
			if (bpf_map_update_elem(fwd, &mod, &sc->eff, BPF_ANY))
				return 0;	/* not reached: an array's update of a valid index */
			if (changed) {
				struct lft_rec rec = { bpf_ktime_get_ns(), dev, mod, changed };

				bpf_ringbuf_output(&sma_log, &rec, sizeof(rec), 0);
			}
		}
		return raw->b;
	}
	}
	return 0;
}

/* A directed-route walk: an outward SMP relayed here (hop hp of n, out on the checked port o)
 * is carried to its last hop and its answer back here within this one run, across the cables
 * between (each with a walk slot: both ends' SMAs in the kernel, nothing else on them), as the
 * SMAs of every hop would have relayed and answered it: ReturnPath[hp..n] the ingress ports,
 * HopPointer hp again, both LIDs permissive, D=1, the target's attribute (an LFT Set applied),
 * the CRCs recomputed; each cable crossed twice counted on both its ends (sma_vcnt). Anything
 * a hop's program would have handed up (a port or link down, a disabled node, a switch that
 * is not one, an attribute or M_Key decision for the agent, more than WALK_MAX hops) and the
 * walk returns -1 before it has changed anything: the frame is relayed here one hop, as
 * without the walk. */
static __always_inline long walk(struct __sk_buff *skb, __u8 *p, void *end, const __u32 *t, __u32 dev,
				 __u32 ingress, struct out_val *o, __u32 hp, __u32 n)
{
	struct out_val *back, *ob;
	struct port_val *pn;
	struct dev_val *cdv = 0;
	struct lft_scratch *sc;
	struct vcnt *vc;
	__u32 cdev = 0, cin = 0, e, i, c, zero = 0, hops = n - hp;
	__u64 rp = 0, mac;	/* the ingress ports of hops hp + 1 .. n, a byte each */
	__u8 *img;
	int patch = -1;

	/* what the last hop would leave to its agent whatever it is: no walk to find that out */
	if (hops > WALK_MAX || !kernel_method(p) || be16(p + MAD + 34) != 0xffff)
		return -1;
	back = bpf_map_lookup_elem(&sma_out, &(__u32){ (dev << 8) | (ingress & 0xff) });
	sc = bpf_map_lookup_elem(&sma_scratch, &zero);
	if (!back || !back->up || !sc)
		return -1;
#pragma clang loop unroll(disable)	/* a bounded loop (kernels from 5.3) */
	for (i = 0; i < WALK_MAX; i++) {
		/* across o's cable to the port it faces: that port's SMA would take it */
		mac = 0;
		__builtin_memcpy(&mac, o->peer, 6);
		pn = bpf_map_lookup_elem(&sma_ports, &mac);
		if (!pn || !(pn->flags & FLAG_ENABLED))
			return -1;
		cdev = pn->dev;
		cin = pn->port;
		cdv = bpf_map_lookup_elem(&sma_dev, &cdev);
		if (!cdv || cin == 0 || cin > cdv->num_ports || !port_link_up(cdev, cin))
			return -1;
		ob = bpf_map_lookup_elem(&sma_out, &(__u32){ (cdev << 8) | (cin & 0xff) });
		if (!ob || !ob->up || !ob->slot)	/* the answer comes back this way */
			return -1;
		sc->slots[(2 * i) & (2 * WALK_MAX - 1)] = o->slot;
		sc->slots[(2 * i + 1) & (2 * WALK_MAX - 1)] = ob->slot;
		rp |= (__u64)(cin & 0xff) << (8 * i);
		if (i + 1 >= hops)
			break;
		/* an intermediate hop: a switch relays it out on InitialPath[hp + i + 2] */
		if (!cdv->is_switch)
			return -1;
		e = byte_at(p, end, INITIAL_PATH + ((hp + i + 2) & 63));
		if (e == 0 || e > cdv->num_ports || !port_link_up(cdev, e))
			return -1;
		o = bpf_map_lookup_elem(&sma_out, &(__u32){ (cdev << 8) | (e & 0xff) });
		if (!o || !o->up || !o->slot)
			return -1;
	}
	/* the last hop's SMA answers it (its M_Key guard) */
	if (!cdv || !answerable(p, cdv, cdev, cin))
		return -1;
	img = attr_image(p, cdv, cdev, cin, &patch);
	if (!img)
		return -1;
	__builtin_memcpy(p + DATA, img, 64);
	if (patch == 28)
		p[DATA + 28] = cin;
	p[MAD + 3] = 0x81;	/* GetResp */
	p[MAD + 4] = 0x80;	/* D, status 0 */
	p[MAD + 5] = 0;
	p[MAD + 6] = hp;
	set_byte_at(p, end, RETURN_PATH + (hp & 63), ingress);
#pragma clang loop unroll(disable)
	for (i = 0; i < WALK_MAX; i++) {
		if (i >= hops)
			break;
		set_byte_at(p, end, RETURN_PATH + ((hp + 1 + i) & 63), rp >> (8 * i));
	}
	p[LRH + 6] = 0xff;
	p[LRH + 7] = 0xff;
	reseal(p, end, t);
#pragma clang loop unroll(disable)
	for (i = 0; i < 2 * WALK_MAX; i++) {
		if (i >= 2 * hops)
			break;
		c = sc->slots[i & (2 * WALK_MAX - 1)];
		vc = bpf_map_lookup_elem(&sma_vcnt, &c);
		if (vc) {
			__sync_fetch_and_add(&vc->tx, 1);
			__sync_fetch_and_add(&vc->rx, 1);
		}
	}
	__builtin_memcpy(p, back->peer, 6);
	__builtin_memcpy(p + 6, back->own, 6);
	skb->cb[0] = back->ifindex;
	return bpf_redirect(back->ifindex, 0);
}

SEC("tc")
int ibemu_sma(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u8 *p = data;
	struct port_val *in;
	struct dev_val *dv;
	struct out_val *out = 0;
	__u32 *t;
	__u32 zero = 0, dev, ingress, egress, hp, n, lid, lmc, slid = 0, my_lid = 0, ic = 0, vc = 0;
	int answer, lid_routed, transit = 0, route_later = 0, rp_at = -1, new_hp = -1;
	__u32 dlid;
	__u64 mac = 0;

	if (skb->len != FRAME_LEN || data + FRAME_LEN > end)
		return PASS;
	/* a canonical management packet (the shape of every one ibemu sends) */
	if (p[12] != 0x88 || p[13] != 0xb5 || (p[LRH] & 0xf0) != 0xf0 || (p[LRH + 1] & 3) != 2)
		return PASS;
	if ((p[LRH + 4] & 0x07) || p[LRH + 5] != 72 || p[BTH] != 0x64 || (p[BTH + 1] & 0x30))
		return PASS;
	if (p[BTH + 5] | p[BTH + 6] | p[BTH + 7])
		return PASS;
	if (p[MAD + 1] != 0x81 && p[MAD + 1] != 0x01)
		return PASS;

	/* the receiving port: keyed by its MAC, checked against the ingress interface */
	__builtin_memcpy(&mac, p, 6);
	in = bpf_map_lookup_elem(&sma_ports, &mac);
	if (!in || in->ifindex != skb->ifindex || !(in->flags & FLAG_ENABLED))
		return PASS;
	dev = in->dev;
	ingress = in->port;
	dv = bpf_map_lookup_elem(&sma_dev, &dev);
	if (!dv || ingress == 0 || ingress > dv->num_ports)
		return PASS;
	/* the agent drops VL15 on a port whose link is not up: so does this */
	if (!port_link_up(dev, ingress))
		return PASS;
	t = bpf_map_lookup_elem(&sma_crc, &zero);
	if (!t)
		return PASS;
	egress = ingress;
	lid_routed = p[MAD + 1] == 0x01;
	dlid = be16(p + LRH + 2);
	if (dlid != 0xffff) {
		/* addressed by LID: this port's (a switch's: port 0's), else in transit */
		__u8 *pi = image(dev, ATTR_PORT_INFO, dv->is_switch ? 0 : ingress);

		if (!pi)
			return PASS;
		lid = be16(pi + 16);
		lmc = dv->is_switch ? 0 : (pi[34] & 7);
		if (!owns_lid(lid, lmc, dlid)) {
			/* a switch forwards it by its LFT, frame unchanged (the agent's _transit) */
			if (!dv->is_switch || dlid >= 0xc000)
				return PASS;
			egress = lft_route(dev, dv, dlid);
			if (egress == 0 || egress == ingress)
				return PASS;
			transit = 1;
			answer = 0;
		} else {
#ifdef NO_LR
			return PASS;
#endif
			if (!lid_routed)	/* the LID-routed tail of a directed route: the agent */
				return PASS;
			slid = be16(p + LRH + 6);
			if (slid == 0 || slid == 0xffff || owns_lid(lid, lmc, slid))
				return PASS;
			my_lid = lid;
			answer = 1;
			/* a switch's response leaves by its LFT, looked up after the attribute's
			 * handler (an LFT Set may change the route back, as in the agent) */
			route_later = dv->is_switch;
		}
	} else if (lid_routed) {
		return PASS;	/* LID-routed to the permissive LID: the agent */
	} else {
		/* directed route */
		hp = p[MAD + 6];
		n = p[MAD + 7];
		if (n == 0 || n > 63 || hp > 63)
			return PASS;
		if (!(p[MAD + 4] & 0x80)) {
			if (hp == 0 || hp > n)
				return PASS;
			if (hp < n) {	/* relay outward: ReturnPath[hp] = ingress, hp + 1 */
				if (!dv->is_switch)
					return PASS;
				rp_at = hp;
				new_hp = hp + 1;
				egress = byte_at(p, end, INITIAL_PATH + (new_hp & 63));
				answer = 0;
			} else {	/* hp == n: ours if DrDLID is permissive */
				if (be16(p + MAD + 34) != 0xffff)
					return PASS;
				/* a neighbour's fault notice (one hop): the notice program takes it */
				if (n == 1 && dv->is_switch && p[MAD + 3] == METHOD_TRAP && p[MAD] == 1 &&
				    p[MAD + 2] == 1 && be16(p + MAD + 16) == ATTR_FAULT_NOTICE) {
					if (!crc_ok(p, end, t))
						return PASS;
					skb->cb[0] = 0;	/* the notice program's first stage */
					skb->cb[1] = dev;
					skb->cb[2] = ingress;
					bpf_tail_call(skb, &sma_tail, 0);
					return PASS;	/* no notice program: the agent */
				}
				rp_at = hp;
				answer = 1;
			}
		} else {
			if (hp < 2 || hp > n)
				return PASS;
			if (!dv->is_switch)
				return PASS;
			new_hp = hp - 1;	/* relay back: hp - 1, out on ReturnPath[hp] */
			egress = byte_at(p, end, RETURN_PATH + (new_hp & 63));
			answer = 0;
		}
		if (!answer) {
			if (egress == 0 || egress > dv->num_ports || !port_link_up(dev, egress))
				return PASS;
		}
	}

	if (!route_later) {
		out = bpf_map_lookup_elem(&sma_out, &(__u32){ (dev << 8) | (egress & 0xff) });
		if (!out || !out->up)
			return PASS;
	}
	/* the strict receive check: a frame that fails goes to the agent, which counts it */
	if (!answer && !crc_ok(p, end, t))
		return PASS;
#ifndef NO_WALK
	if (!answer && rp_at >= 0 && out->slot) {	/* an outward relay: walk it if it can */
		long w = walk(skb, p, end, t, dev, ingress, out, hp, n);

		if (w >= 0)
			return w;
	}
#endif

	if (answer) {
		__u8 *img;
		int patch = -1;

		if (!answerable(p, dv, dev, ingress))
			return PASS;
		if (!crc_ok(p, end, t))	/* before an LFT Set writes anything */
			return PASS;
		img = attr_image(p, dv, dev, ingress, &patch);
		if (!img)
			return PASS;
		if (route_later) {
			/* no route now: the agent takes the frame; an LFT Set it repeats changes
			 * nothing more, and it drops the response as it would have */
			egress = lft_route(dev, dv, slid);
			if (egress == 0)
				return PASS;
			out = bpf_map_lookup_elem(&sma_out, &(__u32){ (dev << 8) | (egress & 0xff) });
			if (!out || !out->up)
				return PASS;
		}
		__builtin_memcpy(p + DATA, img, 64);
		if (patch == 28)
			p[DATA + 28] = ingress;
		p[MAD + 3] = 0x81;	/* GetResp */
		p[MAD + 4] = lid_routed ? 0 : 0x80;	/* D for directed route, status 0 */
		p[MAD + 5] = 0;
		if (lid_routed) {
			p[LRH + 2] = slid >> 8;
			p[LRH + 3] = slid;
			p[LRH + 6] = my_lid >> 8;
			p[LRH + 7] = my_lid;
		}
	}

	/* a relay's CRCs: the incoming ones (checked) patched for the bytes it changes */
	if (!answer && !transit) {
		ic = le32_at(p + ICRC_AT);
		vc = p[VCRC_AT] | ((__u32)p[VCRC_AT + 1] << 8);
		if (!crc_delta(RD_SLID, p[LRH + 6], 0xff, &ic, &vc) ||
		    !crc_delta(RD_SLID + 1, p[LRH + 7], 0xff, &ic, &vc) ||
		    !crc_delta(RD_HP, p[MAD + 6], new_hp, &ic, &vc))
			return PASS;
		if (rp_at >= 0 && !crc_delta(RD_RP + (rp_at & 63), byte_at(p, end, RETURN_PATH + (rp_at & 63)),
					     ingress, &ic, &vc))
			return PASS;
	}
	/* the directed-route fields: nothing above has changed the frame but an LFT Set's data */
	if (rp_at >= 0)
		set_byte_at(p, end, RETURN_PATH + (rp_at & 63), ingress);
	if (new_hp >= 0)
		p[MAD + 6] = new_hp;
	if (!lid_routed && !transit) {	/* a directed-route SMP leaves with both LIDs permissive */
		p[LRH + 6] = 0xff;
		p[LRH + 7] = 0xff;
	}
	/* reseal: ICRC, then the VCRC over it (a frame in transit is unchanged) */
	if (!answer && !transit)
		put_crcs(p, ic, vc);
	else if (!transit)
		reseal(p, end, t);
	__builtin_memcpy(p, out->peer, 6);
	__builtin_memcpy(p + 6, out->own, 6);
	skb->cb[0] = out->ifindex;
	return bpf_redirect(out->ifindex, 0);
}

char _license[] SEC("license") = "GPL";
