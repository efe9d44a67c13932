// SPDX-License-Identifier: GPL-2.0
/*
 * ibemu's fault notices (FailoverConfig 0xFF31, FaultNotice 0xFF32) handled in the kernel:
 * a direct-action tc program that the SMA (sma.c) tail-calls for a FaultNotice it has
 * checked (canonical frame, CRCs good, directed route of one hop at its last hop, DrDLID
 * permissive, a port of a switch whose link is up), skb->cb[1] = device, skb->cb[2] =
 * ingress port. See ibemu/kernel/notice.py for the design and its deviations; the Python
 * switch agent (ibemu/agents/switch.py, SwitchAgent._rx_fault_notice) is the reference
 * this program is proven equal to (tests/integration/test_notice_bpf.py).
 *
 * What it does, as the agent would: for each LID of the notice's bitmap that the switch
 * routes to the receiving port (its LFT entry, the SM's entry of a repaired LID, its
 * alternates: the first up and not a dead end), the port becomes a dead end for the LID;
 * a LID whose way in use was that port moves to its first other way up (raw LFT and
 * forwarding map written), a LID with none is announced onwards once (clones of the
 * notice, bitmap rewritten, on every other up port facing a switch, CRCs patched). One
 * record per notice to the ring buffer sma_nlog tells the agent what was done; the frame
 * is consumed. Anything it does not take (notices off, a port not facing a switch, a
 * switch with more than 63 ports, no maps) goes up to the agent unchanged (TC_ACT_UNSPEC),
 * which counts and ignores it.
 *
 * LOSS (skb->cb[0] bit 8): not a neighbour's notice but the switch's own port cb[2] losing
 * its signal, run by the agent host at the cut (BPF_PROG_TEST_RUN, kernel/notice.py) on a
 * notice of the LIDs the LFT sends to that port: the agent's announce_port_lost. The port
 * counts as up and in use; no dead end is noted, nothing moves (the forwarding classifier
 * takes the alternates of a port without signal by itself); the LIDs with no other way are
 * announced as above; a record only when something was announced, flagged LOSS.
 */
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "frame.h"

#define IP1_AT (INITIAL_PATH + 1)

#define ATTR_NODE_INFO 0x0011
#define ATTR_SWITCH_INFO 0x0012
#define ATTR_PORT_INFO 0x0015
#define ATTR_FAILOVER_CONFIG 0xFF31
#define PHYS_LINK_UP 5
#define MAX_PORT 63
#define PASS TC_ACT_UNSPEC

struct dev_val {
	__u32 lft_base;
	__u16 lft_blocks;
	__u8 is_switch, num_ports;
};
struct attr_key {
	__u32 dev, attr, mod;
};
struct lft_block {
	__u8 b[64];
};
struct alt_block {
	__u8 b[256];
};
struct nkey {		/* sma_nstate key: (device, 64-LID block) */
	__u32 dev, block;
};
struct nstate {		/* what the switch remembers of notices, per 64-LID block */
	__u32 gen;		/* the FailoverConfig generation it belongs to (else: empty) */
	__u32 pad;
	__u64 announced;	/* bit j: LID announced onwards */
	__u64 dead[64];		/* bit p: port p leads nowhere for the LID (a neighbour said) */
	__u8 sm[64];		/* a repaired LID: the SM's entry */
	__u8 rep[64];		/* a repaired LID: the entry written instead (0: not repaired) */
};
struct nrec {		/* sma_nlog record: one notice handled */
	__u64 t_ns;		/* bpf_ktime_get_ns() once the maps had every move */
	__u32 dev, port, block;
	__u16 sent, flags;
	__u8 bitmap[64];	/* the notice's LIDs */
	__u8 moved[64];		/* moved to another way */
	__u8 noted[64];		/* a dead end noted, the way in use kept */
	__u8 lost[64];		/* no way left */
	__u8 fresh[64];		/* of those, announced now */
	__u8 prev[512];		/* a moved LID: the entry before */
	__u8 now[512];		/* a moved LID: the entry after */
};

/* shared with sma.c (the loader passes the same maps) */
struct ibemu_map sma_out SEC("maps") = { BPF_MAP_TYPE_HASH, 4, sizeof(struct out_val), 65536, 0 };
struct ibemu_map sma_dev SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct dev_val), 16384, 0 };
struct ibemu_map sma_attr SEC("maps") = { BPF_MAP_TYPE_HASH, sizeof(struct attr_key), 64, 131072, 0 };
struct ibemu_map sma_lft SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 64, 768, BPF_F_MMAPABLE };
struct ibemu_map sma_fwd SEC("maps") = { BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, 4, 16384, 0 };
/* of its own: dev -> the switch's alternates (ibemu_lft_alt); the state; the log; the CRC
 * patches per InitialPath[1] value; a zeroed state; the TID counters */
struct ibemu_map sma_alt SEC("maps") = { BPF_MAP_TYPE_ARRAY_OF_MAPS, 4, 4, 16384, 0 };
struct ibemu_map sma_nstate SEC("maps") = { BPF_MAP_TYPE_HASH, sizeof(struct nkey), sizeof(struct nstate), 65536, BPF_F_NO_PREALLOC };
struct ibemu_map sma_nlog SEC("maps") = { BPF_MAP_TYPE_RINGBUF, 0, 0, 1 << 20, 0 };
struct nwork {		/* sma_nwork: the record being built, across the stages */
	struct nrec rec;
	__u64 up;		/* the ports whose link is up */
	__u64 any_fresh;
};
/* [0]: the runs in the softirq (a neighbour's notice); [1]: LOSS runs, in a process's system
 * call, which a softirq may interrupt on the same CPU (one cutting thread at a time) */
struct ibemu_map sma_nwork SEC("maps") = { BPF_MAP_TYPE_PERCPU_ARRAY, 4, sizeof(struct nwork), 2, 0 };
struct ibemu_map sma_nzero SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, sizeof(struct nstate), 1, 0 };
struct ibemu_map sma_ntid SEC("maps") = { BPF_MAP_TYPE_ARRAY, 4, 4, 16384, 0 };

/* [1]: notice_tx.c, which seals the onward notice and sends its clones */
struct ibemu_map sma_tail SEC("maps") = { BPF_MAP_TYPE_PROG_ARRAY, 4, 4, 2, 0 };

static __always_inline __u32 be16(const __u8 *p)
{
	return ((__u32)p[0] << 8) | p[1];
}

static __always_inline __u32 be32(const __u8 *p)
{
	return ((__u32)p[0] << 24) | ((__u32)p[1] << 16) | ((__u32)p[2] << 8) | p[3];
}

static __always_inline __u8 *image(__u32 dev, __u32 attr, __u32 mod)
{
	struct attr_key k = { .dev = dev, .attr = attr, .mod = mod };

	return bpf_map_lookup_elem(&sma_attr, &k);
}

/* Branch-free arithmetic (the verifier walks every iteration of the LID loop and keeps a
 * state per branch it has not followed yet: with a few branches per LID, eight blocks of 64
 * in one program exceeded its limit of 8192 pending states ("The sequence of 8193 jumps is
 * too complex"), then its 1,000,000 instructions; hence one block per tail call, and one
 * branch per LID. BPF has no set-on-condition, so comparisons are written out). Values
 * below 2^32. */
static __always_inline __u64 nz(__u64 x)
{
	return (x + 0xffffffffULL) >> 32;	/* x != 0, for x < 2^32 */
}

static __always_inline __u64 opaque(__u64 x)
{
	asm volatile("" : "+r"(x));	/* keep clang from turning the masks back into branches */
	return x;
}

/* a candidate way p: a port below 64, its link up and not a dead end (avail) */
#define WAY(p)								\
	do {								\
		__u64 _p = (p);						\
		__u64 _ok = opaque((1 ^ nz(_p >> 6)) & ((avail >> (_p & 63)) & 1)); \
		__u64 _in = _ok & (1 ^ nz(_p ^ ingress));		\
		first |= _p & (0 - (_ok & (1 ^ nz(first))));		\
		inw |= _in;						\
		rest |= _p & (0 - (_ok & (1 ^ _in) & (1 ^ nz(rest))));	\
	} while (0)

/* v if m (0 or 1) else x */
#define SEL(m, v, x) ((x) ^ (((x) ^ (v)) & (0 - opaque(m))))

SEC("tc")
int ibemu_notice(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	__u8 *p = data;
	__u32 zero = 0, dev = skb->cb[1], ingress = skb->cb[2], k = skb->cb[0] & 0xff, top, gen, block, port;
	__u32 loss = (skb->cb[0] >> 8) & 1;	/* LOSS: the switch's own port lost its signal */
	__u32 lblk, idx, j, next;
	__u64 sw = 0, bits, moved = 0, noted = 0, lost = 0, fresh = 0, w;
	struct dev_val *dv;
	__u8 *fo, *si, *ni, *ab;
	void *fwd, *alt;
	struct nwork *wk;
	struct nstate *zst, *st;
	struct lft_block *raw, *fb;
	struct nkey key;
	__u32 *tid;

	if (skb->len != FRAME_LEN || data + FRAME_LEN > end)
		return PASS;
	if (ingress == 0 || ingress > MAX_PORT || k > 7 || (skb->cb[0] >> 9))
		return PASS;
	dv = bpf_map_lookup_elem(&sma_dev, &dev);
	if (!dv || !dv->is_switch || dv->lft_blocks == 0 || dv->num_ports > MAX_PORT)
		return PASS;
	fo = image(dev, ATTR_FAILOVER_CONFIG, 0);
	si = image(dev, ATTR_SWITCH_INFO, 0);
	ni = image(dev, ATTR_NODE_INFO, ingress);
	fwd = bpf_map_lookup_elem(&sma_fwd, &dev);
	alt = bpf_map_lookup_elem(&sma_alt, &dev);
	zst = bpf_map_lookup_elem(&sma_nzero, &zero);
	tid = bpf_map_lookup_elem(&sma_ntid, &dev);
	wk = bpf_map_lookup_elem(&sma_nwork, &loss);
	if (!fo || !si || !ni || !fwd || !alt || !zst || !tid || !wk)
		return PASS;
	/* notices off, or from a port the SM did not say faces a switch: the agent counts it */
	if (!(fo[0] & 1))
		return PASS;
	__builtin_memcpy(&sw, fo + 32, 8);	/* ports 0..63, little-endian bits */
	if (!((sw >> ingress) & 1))
		return PASS;
	gen = be32(fo + 4);
	top = be16(si + 6);
	block = be32(p + MAD + 20);
	if (block >= 96)
		return PASS;	/* beyond the unicast LIDs: the agent */

	if (k == 0) {	/* the first stage: the work record, the ports whose link is up */
		wk->up = 0;
		wk->any_fresh = 0;
		wk->rec.sent = 0;
		wk->rec.flags = loss;
		wk->rec.dev = dev;
		wk->rec.port = ingress;
		wk->rec.block = block;
		__builtin_memcpy(wk->rec.bitmap, p + DATA, 64);
#pragma clang loop unroll(disable)
		for (j = 0; j < 32; j++)	/* moved, noted, lost, fresh */
			((__u64 *)wk->rec.moved)[j] = 0;
#pragma clang loop unroll(disable)
		for (port = 1; port <= MAX_PORT; port++) {
			__u8 *pi;

			if (port > dv->num_ports)
				break;
			pi = image(dev, ATTR_PORT_INFO, port);
			if (pi && (pi[33] >> 4) == PHYS_LINK_UP)
				wk->up |= 1ULL << port;
		}
		if (loss)	/* the lost port is the way in use, whatever its PortInfo says yet */
			wk->up |= 1ULL << ingress;
	}

	/* this stage's 64 LIDs (LFT block lblk) */
	k &= 7;
	lblk = block * 8 + k;
	__builtin_memcpy(&bits, wk->rec.bitmap + k * 8, 8);
	key.dev = dev;
	key.block = lblk;
	idx = dv->lft_base + lblk;
	raw = bpf_map_lookup_elem(&sma_lft, &idx);
	fb = bpf_map_lookup_elem(fwd, &lblk);
	ab = bpf_map_lookup_elem(alt, &lblk);
	if (!ab)
		ab = (__u8 *)zst;	/* no alternates in this block: zeros */
	st = 0;
	if (bits && lblk < dv->lft_blocks && raw && fb) {
		st = bpf_map_lookup_elem(&sma_nstate, &key);
		if (!st) {
			bpf_map_update_elem(&sma_nstate, &key, zst, BPF_NOEXIST);
			st = bpf_map_lookup_elem(&sma_nstate, &key);
		}
	}
	if (st && raw && fb) {
		__u64 up = wk->up;

		if (st->gen != gen) {	/* a new generation ended the repairs */
#pragma clang loop unroll(disable)
			for (j = 0; j < sizeof(*st) / 8; j++)
				((__u64 *)st)[j] = 0;
			st->gen = gen;
		}
#pragma clang loop unroll(disable)
		for (j = 0; j < 64; j++) {
			__u64 lid = lblk * 64 + j, rep, cur, smv, first = 0, rest = 0, inw = 0;
			__u64 avail, act, inuse, mv, ls, fr, was, sm_new;

			if (!((bits >> j) & 1))
				continue;	/* the one branch: LIDs not in the notice cost nothing */
			rep = st->rep[j];
			cur = raw->b[j];
			smv = SEL(nz(rep), (__u64)st->sm[j], 0);
			avail = up & ~st->dead[j];
			WAY(cur);
			WAY(smv);
			WAY(ab[j * 4]);
			WAY(ab[j * 4 + 1]);
			WAY(ab[j * 4 + 2]);
			/* a LID of the notice, 0 < LID <= top, the notifying port one of its ways */
			act = opaque(((bits >> j) & 1) & nz(lid) & (1 ^ (((__u64)top - lid) >> 63)) & inw);
			st->dead[j] |= (act & (1 ^ loss)) << ingress;
			inuse = act & (1 ^ nz(first ^ ingress));	/* it was the way in use */
			noted |= (act & (1 ^ inuse) & (1 ^ loss)) << j;
			mv = opaque(inuse & nz(rest) & (1 ^ loss));	/* LOSS: the classifier fails over */
			ls = inuse & (1 ^ nz(rest));
			sm_new = SEL(nz(rep), (__u64)st->sm[j], cur);
			st->sm[j] = SEL(mv, sm_new, (__u64)st->sm[j]);
			st->rep[j] = SEL(mv, rest, rep);
			wk->rec.prev[(k * 64 + j) & 511] = cur;
			wk->rec.now[(k * 64 + j) & 511] = rest;
			raw->b[j] = SEL(mv, rest, cur);
			fb->b[j] = SEL(mv, rest, (__u64)fb->b[j]);
			moved |= mv << j;
			lost |= ls << j;
			was = (st->announced >> j) & 1;
			fr = ls & (1 ^ was);
			st->announced |= fr << j;
			fresh |= fr << j;
		}
		__builtin_memcpy(wk->rec.moved + k * 8, &moved, 8);
		__builtin_memcpy(wk->rec.noted + k * 8, &noted, 8);
		__builtin_memcpy(wk->rec.lost + k * 8, &lost, 8);
		__builtin_memcpy(wk->rec.fresh + k * 8, &fresh, 8);
		wk->any_fresh |= fresh;
	}

	/* the next stage with LIDs, a tail call (one verification per block, not eight) */
	next = 8;
#pragma clang loop unroll(disable)
	for (j = k + 1; j < 8; j++) {
		__builtin_memcpy(&bits, wk->rec.bitmap + (j & 7) * 8, 8);
		if (bits) {
			next = j;
			break;
		}
	}
	if (next < 8) {
		skb->cb[0] = next | loss << 8;
		bpf_tail_call(skb, &sma_tail, 0);
		return TC_ACT_SHOT;	/* not reached */
	}

	wk->rec.t_ns = bpf_ktime_get_ns();
	if (wk->any_fresh) {
		/* the onward notice (the agent's _announce), written over this frame; notice_tx.c
		 * seals it and sends a clone on each port of ``want`` */
		__u32 count = *tid, i;
		__u64 id = ((__u64)(ni[18] << 8 | ni[19]) << 48) | (1ULL << 47) | (1ULL << 46) | count;
		__u64 want = sw & wk->up & ~(1ULL << ingress) & ~1ULL;

		*tid = count + 1;	/* (not atomic: a TID may repeat under two CPUs at once) */
#pragma clang loop unroll(full)
		for (i = 0; i < 8; i++)
			*(__u64 *)(p + DATA + 8 * i) = *(__u64 *)(wk->rec.fresh + 8 * i);
		p[MAD + 0] = 1;
		p[MAD + 1] = 0x81;
		p[MAD + 2] = 1;
		p[MAD + 3] = 5;		/* Trap */
		p[MAD + 4] = 0;
		p[MAD + 5] = 0;
		p[MAD + 6] = 1;		/* HopPointer */
		p[MAD + 7] = 1;		/* HopCount */
#pragma clang loop unroll(full)
		for (i = 0; i < 8; i++)
			p[MAD + 8 + i] = id >> (56 - 8 * i);
		p[MAD + 16] = 0xff;
		p[MAD + 17] = 0x32;
		p[MAD + 18] = 0;
		p[MAD + 19] = 0;
		*(__u64 *)(p + MAD + 24) = 0;			/* M_Key */
		*(__u32 *)(p + MAD + 32) = 0xffffffff;		/* DrSLID, DrDLID */
		*(__u32 *)(p + MAD + 36) = 0;
#pragma clang loop unroll(full)
		for (i = 0; i < 3; i++)
			*(__u64 *)(p + MAD + 40 + 8 * i) = 0;
#pragma clang loop unroll(full)
		for (i = 0; i < 16; i++)	/* both paths; InitialPath[1] per port */
			*(__u64 *)(p + INITIAL_PATH + 8 * i) = 0;
		/* counted as the agent counts them: every up port facing a switch but the ingress */
		w = want - ((want >> 1) & 0x5555555555555555ULL);
		w = (w & 0x3333333333333333ULL) + ((w >> 2) & 0x3333333333333333ULL);
		w = (w + (w >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
		wk->rec.sent = (w * 0x0101010101010101ULL) >> 56;
		bpf_ringbuf_output(&sma_nlog, &wk->rec, sizeof(wk->rec), 0);
		skb->cb[3] = want;
		skb->cb[4] = want >> 32;
		bpf_tail_call(skb, &sma_tail, 1);
		return TC_ACT_SHOT;	/* not reached: the loader puts notice_tx.c at 1 */
	}
	if (!loss)	/* LOSS with nothing to announce: nothing to tell */
		bpf_ringbuf_output(&sma_nlog, &wk->rec, sizeof(wk->rec), 0);
	return TC_ACT_SHOT;
}

char _license[] SEC("license") = "GPL";
