/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What the kernel SMA (sma.c) and the fault notice programs (notice.c, notice_tx.c) share:
 * the map record ibemu's loader (ibemu/kernel/elf.py) reads from the "maps" section, and the
 * layout of a canonical management frame (Ethernet + LRH + BTH + DETH + the 256-byte MAD +
 * ICRC + VCRC: 14 + 290 bytes).
 */
#ifndef IBEMU_FRAME_H
#define IBEMU_FRAME_H

/* A map as ibemu's loader (ibemu/kernel/elf.py) reads it from the "maps" section. */
struct ibemu_map {
	__u32 type, key_size, value_size, max_entries, flags;
};

/* sma_out: dev << 8 | port -> the port's interface and cable (ibemu/kernel/sma.py) */
struct out_val {
	__u32 ifindex, up;	/* its interface, in its node's namespace; carrier */
	__u8 peer[6], own[6];	/* the MACs of the cable's far and near end */
	__u32 slot;		/* its sma_vcnt index; 0: no SMP walks across its cable (sma.c) */
};

#define ETH 14
#define LRH ETH
#define BTH (ETH + 8)
#define MAD (ETH + 28)
#define ICRC_AT (ETH + 284)
#define VCRC_AT (ETH + 288)
#define FRAME_LEN (ETH + 290)
#define DATA (MAD + 64)
#define INITIAL_PATH (MAD + 128)
#define RETURN_PATH (MAD + 192)

#endif
