/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The ICRC and VCRC of a canonical management packet (Ethernet + 290 bytes), for the kernel
 * SMA (sma.c) and the fault notice programs (notice.c, notice_tx.c). The tables are
 * sma_crc's (written by the loader): slicing-by-8, T_k[n] = T_{k-1}[n] >> 8 ^
 * T_0[T_{k-1}[n] & 0xff]; CRC-32 (ICRC) T_0..T_7 at 0..2047, CRC-16 (VCRC) at 2048..4095.
 */
#ifndef IBEMU_CRC_H
#define IBEMU_CRC_H

#include "frame.h"

#define T32(k, i) t[((k) << 8) | ((i) & 0xff)]
#define T16(k, i) t[2048 | ((k) << 8) | ((i) & 0xff)]

/* Byte-wise reflected CRC over frame bytes [from, to), t0 its byte-wise table. */
static __always_inline __u32 crc_bytes(__u8 *p, void *end, const __u32 *t0, __u32 crc,
				       __u32 from, __u32 to)
{
#pragma clang loop unroll(disable)
	for (__u32 i = from; i < to; i++) {
		__u8 *q = p + i;

		if ((void *)(q + 1) > end)
			break;
		crc = t0[(crc ^ *q) & 0xff] ^ (crc >> 8);
	}
	return crc;
}

/* Reflected CRC-32 over frame bytes [from, to), eight bytes per step, then byte-wise. */
static __always_inline __u32 crc32_run(__u8 *p, void *end, const __u32 *t, __u32 crc,
				       __u32 from, __u32 to)
{
	__u32 i = from;

#pragma clang loop unroll(disable)
	for (; i + 8 <= to; i += 8) {
		__u8 *q = p + i;
		__u32 x;

		if ((void *)(q + 8) > end)
			return crc;
		x = crc ^ (q[0] | ((__u32)q[1] << 8) | ((__u32)q[2] << 16) | ((__u32)q[3] << 24));
		crc = T32(7, x) ^ T32(6, x >> 8) ^ T32(5, x >> 16) ^ T32(4, x >> 24) ^
		      T32(3, q[4]) ^ T32(2, q[5]) ^ T32(1, q[6]) ^ T32(0, q[7]);
	}
	return crc_bytes(p, end, t, crc, i, to);
}

/* Reflected CRC-16 over frame bytes [from, to), eight bytes per step, then byte-wise. */
static __always_inline __u32 crc16_run(__u8 *p, void *end, const __u32 *t, __u32 crc,
				       __u32 from, __u32 to)
{
	__u32 i = from;

#pragma clang loop unroll(disable)
	for (; i + 8 <= to; i += 8) {
		__u8 *q = p + i;
		__u32 x;

		if ((void *)(q + 8) > end)
			return crc;
		x = crc ^ (q[0] | ((__u32)q[1] << 8));
		crc = T16(7, x) ^ T16(6, x >> 8) ^ T16(5, q[2]) ^ T16(4, q[3]) ^
		      T16(3, q[4]) ^ T16(2, q[5]) ^ T16(1, q[6]) ^ T16(0, q[7]);
	}
	return crc_bytes(p, end, t + 2048, crc, i, to);
}

/* ICRC: LRH with the VL nibble as ones, BTH byte 4 as ones (ib-wire.md, CRCs). */
static __always_inline __u32 icrc(__u8 *p, void *end, const __u32 *t)
{
	__u32 crc = 0xffffffff;

	crc = T32(0, crc ^ (p[LRH] | 0xf0)) ^ (crc >> 8);
	crc = crc32_run(p, end, t, crc, LRH + 1, BTH + 4);
	crc = T32(0, crc ^ 0xff) ^ (crc >> 8);
	crc = crc32_run(p, end, t, crc, BTH + 5, ICRC_AT);
	return crc ^ 0xffffffff;
}

static __always_inline __u32 vcrc(__u8 *p, void *end, const __u32 *t)
{
	return crc16_run(p, end, t, 0xffff, LRH, VCRC_AT) ^ 0xffff;
}

/* Both CRCs written, least-significant byte first. */
static __always_inline void put_crcs(__u8 *p, __u32 ic, __u32 vc)
{
	p[ICRC_AT] = ic;
	p[ICRC_AT + 1] = ic >> 8;
	p[ICRC_AT + 2] = ic >> 16;
	p[ICRC_AT + 3] = ic >> 24;
	p[VCRC_AT] = vc;
	p[VCRC_AT + 1] = vc >> 8;
}

/* A frame's CRCs recomputed: the ICRC, then the VCRC over it. */
static __always_inline void reseal(__u8 *p, void *end, const __u32 *t)
{
	__u32 ic = icrc(p, end, t);

	p[ICRC_AT] = ic;
	p[ICRC_AT + 1] = ic >> 8;
	p[ICRC_AT + 2] = ic >> 16;
	p[ICRC_AT + 3] = ic >> 24;
	put_crcs(p, ic, vcrc(p, end, t));
}

#endif
