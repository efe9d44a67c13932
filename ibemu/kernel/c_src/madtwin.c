// SPDX-License-Identifier: GPL-2.0
/*
 * madtwin: the hot data path of one MAD-socket client slot (OpenSM's), in C.
 *
 * The agent host serves ibsim's client protocol (ibemu/hca/umad_server.py) in Python. For
 * every SMP of OpenSM it would read the 288-byte sim_request, frame it in the CA agent, send
 * it (the kernel then runs the SMP's whole round trip through the switches' eBPF SMA on that
 * CPU), take the response off the CA's packet socket, check it and write it back to OpenSM:
 * some 100 us of Python per SMP. This program does that part as the HCA would, for one slot;
 * the design is ibemu/sm/directport.py's (ibemu's own SM), here on behalf of a MAD-socket
 * client. See ibemu/kernel/madtwin.py for how it is started, owned and read.
 *
 * File descriptors handed over by the agent host:
 *   --data-fd   the slot's server data socket (<base>:out<slot>, connected to the client):
 *               this program reads every datagram the client sends and writes the replies
 *               it makes; the agent host keeps its own descriptor of the same socket and
 *               writes its replies there too (datagrams are atomic, so both may write).
 *   --fwd-fd    a SOCK_SEQPACKET socketpair end: every datagram this program does not take
 *               is forwarded there unchanged, and the agent host handles it as if it had read
 *               it from the slot (control stays on <base>:ctl with the agent host anyway).
 *               End of file on it (the agent host closed it or died) ends this program.
 *               (Its end is the agent host's alone: close-on-exec, never inherited.)
 *   --pkt-fd    an AF_PACKET socket on the client host's HCA veth (its namespace), with a
 *               classic BPF filter that passes only QP0 GetResp frames whose TID bits 48-63
 *               are TID_TAG (ibemu/kernel/madtwin.py: TWIN_REPLIES).
 *   --stats-fd  a memfd of one page: struct twin_stats, updated in place (the agent host
 *               maps it too and reads the counters live; they outlive this process).
 *
 * Taken here (everything else is forwarded): a directed-route SMP Get or Set that leaves the
 * host, i.e. BaseVersion 1, D bit clear, HopPointer 0, HopCount 1..63, DrSLID permissive,
 * InitialPath[1] = our port, sim_request dqp 0 and status 0, while the veth has carrier.
 * It is framed as the CA agent frames it (ibemu.agents.ca.CaAgent.send_mad: HopPointer 0 -> 1,
 * C14-9:1 at the source; wire.madpacket.frame_mad: LRH on VL15, SL 0, DLID = SLID = 0xFFFF,
 * BTH UD SEND Only, P_Key 0xFFFF, QP0, PSN from our own counter, DETH Q_Key 0, SrcQP 0, ICRC,
 * VCRC), with TID bits 48-63 = TID_TAG: no MAD-socket slot has that number, so the CA agent's
 * own packet socket drops the response in the kernel (sockfilter.CA_MANAGEMENT) and it
 * reaches this program only. The response is checked as the CA agent checks it (304-byte
 * frame, LRH/BTH shape, PktLen, ICRC, VCRC), the returning-SMP rule at the source applied
 * (dr.on_receive at a CA: D=1, HopPointer 1 -> 0, DrSLID permissive), the client's own TID put
 * back, and it is written to the client as the agent host would have: dlid/slid from the LRH,
 * dqp from the BTH, sqp from the DETH, status 0, pad 0, length 256. A request unanswered after
 * --timeout-ns (CaMadPort's 0.5 s, in real time) goes back to the client with status 110.
 *
 * Test modes (no sockets; tests/unit/test_madtwin.py compares them with the Python path):
 *   madtwin frame [--port N]   stdin: sim_requests; stdout: one line per request, the hex of
 *                              the 290-byte packet (PSN 1, 2, ...), or "-" (forwarded)
 *   madtwin reply [--port N]   stdin: (sim_request, 290-byte response packet) pairs; stdout:
 *                              the hex of the datagram the client gets, or "-" (dropped)
 *
 * Build: cc -O2 -Wall -o madtwin madtwin.c (the Makefile's `native` target).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <net/if.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* sim_request (ibsim's include/ibsim.h): 288 bytes, big-endian fields. */
#define REQ_LEN 288
#define R_DLID 0
#define R_SLID 4
#define R_DQP 8
#define R_SQP 12
#define R_STATUS 16
#define R_PAD 20
#define R_LENGTH 24
#define R_MAD 32

/* A MAD packet on the wire: LRH(8) BTH(12) DETH(8) MAD(256) ICRC(4) VCRC(2). */
#define MAD_LEN 256
#define MAD_OFF 28
#define PKT_LEN 290
#define ICRC_AT 284
#define VCRC_AT 288
#define PKTLEN_WORDS 72
#define UD_SEND_ONLY 0x64
#define ETH_LEN 14
#define FRAME_LEN (ETH_LEN + PKT_LEN)

/* Offsets inside the MAD. */
#define M_BASE_VERSION 0
#define M_CLASS 1
#define M_METHOD 3
#define M_STATUS 4
#define M_HOP_POINTER 6
#define M_HOP_COUNT 7
#define M_TID 8
#define M_DR_SLID 32
#define INITIAL_PATH 128

#define CLASS_SMP_DR 0x81
#define GET 0x01
#define SET 0x02
#define GET_RESP 0x81
#define PERMISSIVE 0xFFFF
#define MAX_HOPS 63
#define TID_TAG 0xFFFF /* sockfilter.SM_OWN_TID_TAG */
#define STATUS_TIMEOUT 110

/* The counters, in the order ibemu/kernel/madtwin.py names them (COUNTERS). */
enum {
	C_SENT,           /* requests framed and sent on the packet socket */
	C_ANSWERED,       /* responses written back to the client */
	C_TIMED_OUT,      /* requests returned with status 110 */
	C_BAD_FRAME,      /* received frames that failed the check (length, shape, ICRC, VCRC) */
	C_NOT_PENDING,    /* well-formed responses to no pending request (late, duplicate) */
	C_DR_DISCARD,     /* responses the returning-SMP rule discards (hop pointer, DrSLID) */
	C_FORWARDED,      /* client datagrams forwarded to the agent host */
	C_NO_CARRIER,     /* ... of which, because the veth had no carrier */
	C_CLIENT_DROPPED, /* replies the client's socket refused (queue full past ours, error) */
	C_SEND_ERROR,     /* frames the packet socket refused (the request then times out) */
	C_PENDING,        /* requests waiting now (a gauge) */
	C_RTT_NS,         /* sum over answered requests of send -> response read, ns */
	C_RTT_MAX_NS,     /* the longest of those */
	NCOUNTERS,
};
#define STATS_MAGIC 0x6e69777464616dULL /* "madtwin" */
struct twin_stats {
	uint64_t magic;
	uint64_t pid;
	uint64_t c[NCOUNTERS];
};

/* ------------------------------------------------------------------------- CRCs */

/* Both CRCs are reflected, so each is computed eight bytes a step from eight tables (slicing
 * by 8: table k gives a byte's effect k bytes further on), some five times faster than a byte
 * a step; the twin runs four passes per SMP. */
static uint32_t crc32_tab[8][256];
static uint32_t vcrc_tab[8][256];

static void crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i; /* CRC-32 (zlib's): reflected, poly 0x04C11DB7 */
		uint32_t v = i; /* VCRC: CRC-16, poly 0x100B, reflected */
		for (int k = 0; k < 8; k++) {
			c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
			v = v & 1 ? (v >> 1) ^ 0xD008u : v >> 1;
		}
		crc32_tab[0][i] = c;
		vcrc_tab[0][i] = v;
	}
	for (int k = 1; k < 8; k++)
		for (uint32_t i = 0; i < 256; i++) {
			crc32_tab[k][i] = (crc32_tab[k - 1][i] >> 8) ^ crc32_tab[0][crc32_tab[k - 1][i] & 0xFF];
			vcrc_tab[k][i] = (vcrc_tab[k - 1][i] >> 8) ^ vcrc_tab[0][vcrc_tab[k - 1][i] & 0xFF];
		}
}

static uint32_t le32(const uint8_t *p) { return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* One reflected CRC of up to 32 bits (its tables ``t``) over ``n`` more bytes. */
static uint32_t crc_more(uint32_t (*t)[256], uint32_t crc, const uint8_t *p, size_t n)
{
	for (; n >= 8; p += 8, n -= 8) {
		uint32_t a = crc ^ le32(p), b = le32(p + 4);
		crc = t[7][a & 0xFF] ^ t[6][(a >> 8) & 0xFF] ^ t[5][(a >> 16) & 0xFF] ^ t[4][a >> 24] ^
		      t[3][b & 0xFF] ^ t[2][(b >> 8) & 0xFF] ^ t[1][(b >> 16) & 0xFF] ^ t[0][b >> 24];
	}
	while (n--)
		crc = t[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
	return crc;
}

/* ICRC of a 290-byte native packet without GRH: the VL nibble and BTH byte 4 (resv8a) count
 * as ones (ib-wire.md "CRCs"). */
static uint32_t icrc(const uint8_t *pkt)
{
	uint8_t masked[13];
	memcpy(masked, pkt, 12);
	masked[0] |= 0xF0;
	masked[12] = 0xFF;
	uint32_t crc = crc_more(crc32_tab, 0xFFFFFFFFu, masked, sizeof(masked));
	return crc_more(crc32_tab, crc, pkt + 13, ICRC_AT - 13) ^ 0xFFFFFFFFu;
}

/* VCRC over LRH .. ICRC (init and xorout 0xFFFF). */
static uint16_t vcrc(const uint8_t *pkt)
{
	return crc_more(vcrc_tab, 0xFFFF, pkt, VCRC_AT) ^ 0xFFFF;
}

static void seal(uint8_t *pkt) /* both written least-significant byte first */
{
	uint32_t i = icrc(pkt);
	for (int k = 0; k < 4; k++)
		pkt[ICRC_AT + k] = i >> (8 * k);
	uint16_t v = vcrc(pkt);
	pkt[VCRC_AT] = v & 0xFF;
	pkt[VCRC_AT + 1] = v >> 8;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }
static uint16_t be16(const uint8_t *p) { return p[0] << 8 | p[1]; }
static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }

/* ------------------------------------------------------------------------- requests */

/* Frame ``req`` into ``pkt`` (290 bytes) if it is ours to send: 1, else 0 (forward it). */
static int frame_request(const uint8_t *req, uint8_t *pkt, uint32_t psn, int port)
{
	const uint8_t *mad = req + R_MAD;
	int method = mad[M_METHOD], n = mad[M_HOP_COUNT];
	if (mad[M_BASE_VERSION] != 1 || mad[M_CLASS] != CLASS_SMP_DR || (method != GET && method != SET))
		return 0;
	if (be32(req + R_DQP) || be32(req + R_STATUS))
		return 0;
	if (mad[M_STATUS] & 0x80 || mad[M_HOP_POINTER] || n < 1 || n > MAX_HOPS ||
	    be16(mad + M_DR_SLID) != PERMISSIVE || mad[INITIAL_PATH + 1] != port)
		return 0;
	/* LRH: VL15, LVer 0, SL 0, LNH 2; DLID, PktLen, SLID */
	pkt[0] = 15 << 4;
	pkt[1] = 2;
	put16(pkt + 2, PERMISSIVE);
	put16(pkt + 4, PKTLEN_WORDS);
	put16(pkt + 6, PERMISSIVE);
	/* BTH: UD SEND Only, no SE/M/pad, P_Key 0xFFFF, DestQP 0, PSN */
	pkt[8] = UD_SEND_ONLY;
	pkt[9] = 0;
	put16(pkt + 10, 0xFFFF);
	put32(pkt + 12, 0);
	put32(pkt + 16, psn & 0xFFFFFF);
	/* DETH: Q_Key 0 (QP0), SrcQP 0 */
	put32(pkt + 20, 0);
	put32(pkt + 24, 0);
	uint8_t *m = pkt + MAD_OFF;
	memcpy(m, mad, MAD_LEN);
	put16(m + M_TID, TID_TAG);
	m[M_HOP_POINTER] = 1; /* C14-9:1 at the source */
	seal(pkt);
	return 1;
}

/* ------------------------------------------------------------------------- pending */

#define MAX_PENDING 4096
struct pending {
	uint64_t tid48;    /* TID bits 0-47 as sent */
	uint64_t deadline; /* CLOCK_MONOTONIC ns */
	uint64_t sent;     /* CLOCK_MONOTONIC ns */
	uint8_t req[REQ_LEN];
	int used;
};
static struct pending pending[MAX_PENDING];
static int npending;

static uint64_t tid48_of(const uint8_t *mad)
{
	uint64_t t = 0;
	for (int i = 2; i < 8; i++)
		t = t << 8 | mad[M_TID + i];
	return t;
}

static struct pending *find_pending(uint64_t tid48)
{
	for (int i = 0, seen = 0; i < MAX_PENDING && seen < npending; i++) {
		if (!pending[i].used)
			continue;
		seen++;
		if (pending[i].tid48 == tid48)
			return &pending[i];
	}
	return NULL;
}

/* Remember ``req`` (a request with the same TID replaces the older one, as the Python
 * path's table does). NULL when full: the caller forwards the request instead. */
static struct pending *add_pending(const uint8_t *req, uint64_t sent, uint64_t deadline)
{
	uint64_t tid48 = tid48_of(req + R_MAD);
	struct pending *p = find_pending(tid48);
	if (!p) {
		if (npending == MAX_PENDING)
			return NULL;
		for (int i = 0; i < MAX_PENDING; i++)
			if (!pending[i].used) {
				p = &pending[i];
				break;
			}
		p->used = 1;
		npending++;
	}
	p->tid48 = tid48;
	p->sent = sent;
	p->deadline = deadline;
	memcpy(p->req, req, REQ_LEN);
	return p;
}

static void drop_pending(struct pending *p)
{
	p->used = 0;
	npending--;
}

/* The request returned with status 110, as CaMadPort.expire + UmadSession.route write it. */
static void timeout_reply(const uint8_t *req, uint8_t *out)
{
	memcpy(out, req, REQ_LEN);
	put32(out + R_STATUS, STATUS_TIMEOUT);
	memset(out + R_PAD, 0, 4);
	memset(out + R_LENGTH, 0, 8);
	put16(out + R_LENGTH + 6, MAD_LEN);
}

/* ------------------------------------------------------------------------- responses */

enum { RX_OK, RX_BAD_FRAME, RX_NOT_PENDING, RX_DR_DISCARD };

/* Check a received packet (LRH .. VCRC, ``len`` bytes) as the CA agent would and, when it
 * answers a pending request, write the client's datagram to ``out``. */
static int take_response(const uint8_t *pkt, size_t len, uint8_t *out, struct pending **which)
{
	if (len != PKT_LEN || (pkt[1] & 3) != 2 || pkt[5] != PKTLEN_WORDS || pkt[4] & 0x07 ||
	    pkt[8] != UD_SEND_ONLY || pkt[9] & 0x30)
		return RX_BAD_FRAME;
	uint32_t i = icrc(pkt);
	uint16_t v = vcrc(pkt);
	if (pkt[ICRC_AT] != (i & 0xFF) || pkt[ICRC_AT + 1] != ((i >> 8) & 0xFF) ||
	    pkt[ICRC_AT + 2] != ((i >> 16) & 0xFF) || pkt[ICRC_AT + 3] != i >> 24 ||
	    pkt[VCRC_AT] != (v & 0xFF) || pkt[VCRC_AT + 1] != v >> 8)
		return RX_BAD_FRAME;
	const uint8_t *mad = pkt + MAD_OFF;
	if (mad[M_CLASS] != CLASS_SMP_DR || mad[M_METHOD] != GET_RESP || be16(mad + M_TID) != TID_TAG)
		return RX_NOT_PENDING; /* the filter lets only these through */
	struct pending *p = find_pending(tid48_of(mad));
	if (!p)
		return RX_NOT_PENDING;
	/* dr.on_receive at a CA, returning: LRH DLID permissive, HopCount 1..63, D=1,
	 * HopPointer 1 -> 0, DrSLID permissive; anything else is discarded. */
	int n = mad[M_HOP_COUNT];
	if (be16(pkt + 2) != PERMISSIVE || n < 1 || n > MAX_HOPS || !(mad[M_STATUS] & 0x80) ||
	    mad[M_HOP_POINTER] != 1 || be16(mad + M_DR_SLID) != PERMISSIVE)
		return RX_DR_DISCARD;
	memset(out, 0, R_MAD);
	put16(out + R_DLID, be16(pkt + 2));
	put16(out + R_SLID, be16(pkt + 6));
	put32(out + R_DQP, be32(pkt + 12) & 0xFFFFFF);
	put32(out + R_SQP, be32(pkt + 24) & 0xFFFFFF);
	put16(out + R_LENGTH + 6, MAD_LEN);
	memcpy(out + R_MAD, mad, MAD_LEN);
	out[R_MAD + M_HOP_POINTER] = 0;
	memcpy(out + R_MAD + M_TID, p->req + R_MAD + M_TID, 2); /* the client's TID bits 48-63 */
	*which = p;
	return RX_OK;
}

/* ------------------------------------------------------------------------- test modes */

static void print_hex(const uint8_t *p, size_t n)
{
	static const char digits[] = "0123456789abcdef";
	char line[2 * PKT_LEN + 2]; /* the longest line: a packet */
	for (size_t i = 0; i < n; i++) {
		line[2 * i] = digits[p[i] >> 4];
		line[2 * i + 1] = digits[p[i] & 15];
	}
	line[2 * n] = '\n';
	fwrite(line, 1, 2 * n + 1, stdout);
}

static int test_mode(const char *mode, int port)
{
	uint8_t req[REQ_LEN], pkt[PKT_LEN], out[REQ_LEN];
	uint32_t psn = 0;
	int reply = !strcmp(mode, "reply");
	while (fread(req, 1, REQ_LEN, stdin) == REQ_LEN) {
		if (!reply) {
			if (frame_request(req, pkt, psn + 1, port)) { /* the PSN counts framed requests */
				psn++;
				print_hex(pkt, PKT_LEN);
			}
			else
				puts("-");
			continue;
		}
		if (fread(pkt, 1, PKT_LEN, stdin) != PKT_LEN)
			return 1;
		struct pending *p;
		npending = 0;
		memset(pending, 0, sizeof(pending[0]));
		add_pending(req, 0, 0);
		if (take_response(pkt, PKT_LEN, out, &p) == RX_OK)
			print_hex(out, REQ_LEN);
		else
			puts("-");
		drop_pending(&pending[0]);
	}
	return 0;
}

/* ------------------------------------------------------------------------- serving */

/* A queue of datagrams for a socket that said EAGAIN; sent when it is writable again. */
#define QUEUE 512
struct outq {
	int fd, head, count;
	uint8_t buf[QUEUE][REQ_LEN];
};

static struct twin_stats *stats;
static struct twin_stats scratch_stats;

static void flush(struct outq *q)
{
	while (q->count) {
		if (send(q->fd, q->buf[q->head], REQ_LEN, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return;
			stats->c[C_CLIENT_DROPPED]++;
		}
		q->head = (q->head + 1) % QUEUE;
		q->count--;
	}
}

/* Send one datagram on ``q``'s socket, queued behind what waits already. */
static void put(struct outq *q, const uint8_t *dgram)
{
	flush(q);
	if (!q->count) {
		if (send(q->fd, dgram, REQ_LEN, MSG_DONTWAIT | MSG_NOSIGNAL) == REQ_LEN)
			return;
		if (errno != EAGAIN && errno != EINTR) {
			stats->c[C_CLIENT_DROPPED]++;
			return;
		}
	}
	if (q->count == QUEUE) {
		stats->c[C_CLIENT_DROPPED]++;
		return;
	}
	memcpy(q->buf[(q->head + q->count) % QUEUE], dgram, REQ_LEN);
	q->count++;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

static int has_carrier(int fd, const char *ifname)
{
	struct ifreq ifr;
	memset(&ifr, 0, sizeof(ifr));
	strncpy(ifr.ifr_name, ifname, IFNAMSIZ - 1);
	if (ioctl(fd, SIOCGIFFLAGS, &ifr) < 0)
		return 1; /* cannot tell: let the request go, it times out if lost */
	return (ifr.ifr_flags & (IFF_UP | IFF_RUNNING)) == (IFF_UP | IFF_RUNNING);
}

struct twin {
	int data_fd, fwd_fd, pkt_fd, port;
	const char *ifname;
	uint8_t eth[ETH_LEN];
	uint64_t timeout_ns;
	uint32_t psn;
	struct outq *client, *agent;
};

static void on_request(struct twin *t, const uint8_t *req, ssize_t len)
{
	uint8_t frame[FRAME_LEN];
	if (len != REQ_LEN || !frame_request(req, frame + ETH_LEN, t->psn + 1, t->port) ||
	    npending == MAX_PENDING) {
		goto forward;
	}
	if (!has_carrier(t->pkt_fd, t->ifname)) { /* the CA agent answers 110 at once */
		stats->c[C_NO_CARRIER]++;
		goto forward;
	}
	t->psn = (t->psn + 1) & 0xFFFFFF;
	memcpy(frame, t->eth, ETH_LEN);
	uint64_t now = now_ns();
	add_pending(req, now, now + t->timeout_ns);
	if (send(t->pkt_fd, frame, FRAME_LEN, MSG_DONTWAIT) != FRAME_LEN)
		stats->c[C_SEND_ERROR]++; /* lost like a frame on a cable: the timeout answers */
	else
		stats->c[C_SENT]++;
	return;
forward:
	stats->c[C_FORWARDED]++;
	if (len != REQ_LEN) { /* the agent host counts a bad size; send it as it came */
		if (send(t->fwd_fd, req, len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
			stats->c[C_CLIENT_DROPPED]++;
		return;
	}
	put(t->agent, req);
}

static void on_frame(struct twin *t, const uint8_t *frame, ssize_t len)
{
	uint8_t out[REQ_LEN];
	struct pending *p = NULL;
	int rc = len < ETH_LEN ? RX_BAD_FRAME : take_response(frame + ETH_LEN, len - ETH_LEN, out, &p);
	switch (rc) {
	case RX_OK: {
		uint64_t rtt = now_ns() - p->sent;
		stats->c[C_RTT_NS] += rtt;
		if (rtt > stats->c[C_RTT_MAX_NS])
			stats->c[C_RTT_MAX_NS] = rtt;
		drop_pending(p);
		put(t->client, out);
		stats->c[C_ANSWERED]++;
		break;
	}
	case RX_BAD_FRAME:
		stats->c[C_BAD_FRAME]++;
		break;
	case RX_NOT_PENDING:
		stats->c[C_NOT_PENDING]++;
		break;
	default:
		stats->c[C_DR_DISCARD]++;
	}
}

static uint64_t expire(struct twin *t, uint64_t now)
{
	uint64_t earliest = 0;
	uint8_t out[REQ_LEN];
	for (int i = 0, seen = 0; i < MAX_PENDING && seen < npending; i++) {
		struct pending *p = &pending[i];
		if (!p->used)
			continue;
		seen++;
		if (p->deadline <= now) {
			timeout_reply(p->req, out);
			drop_pending(p);
			seen--;
			put(t->client, out);
			stats->c[C_TIMED_OUT]++;
		} else if (!earliest || p->deadline < earliest) {
			earliest = p->deadline;
		}
	}
	return earliest;
}

static int serve(struct twin *t)
{
	static struct outq client, agent;
	client.fd = t->data_fd;
	agent.fd = t->fwd_fd;
	t->client = &client;
	t->agent = &agent;
	uint8_t buf[4096];
	for (;;) {
		uint64_t earliest = expire(t, now_ns());
		int timeout = -1;
		if (earliest) {
			uint64_t now = now_ns();
			timeout = earliest > now ? (int)((earliest - now) / 1000000u) + 1 : 0;
		}
		stats->c[C_PENDING] = npending;
		struct pollfd fds[3] = {
			{.fd = t->pkt_fd, .events = POLLIN},
			{.fd = t->data_fd, .events = POLLIN | (client.count ? POLLOUT : 0)},
			{.fd = t->fwd_fd, .events = POLLIN | (agent.count ? POLLOUT : 0)},
		};
		if (poll(fds, 3, timeout) < 0) {
			if (errno == EINTR)
				continue;
			perror("madtwin: poll");
			return 1;
		}
		if (fds[2].revents & (POLLIN | POLLHUP | POLLERR)) {
			ssize_t n = recv(t->fwd_fd, buf, sizeof(buf), MSG_DONTWAIT);
			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
				return 0; /* the agent host closed its end: the slot is its own again */
		}
		/* responses first: they free their requests' places. Only a socket poll said is
		 * readable is read (one system call fewer per idle socket and wake-up: they run on
		 * OpenSM's CPU) */
		for (int k = 0; k < 256 && fds[0].revents & POLLIN; k++) {
			ssize_t n = recv(t->pkt_fd, buf, sizeof(buf), MSG_DONTWAIT | MSG_TRUNC);
			if (n < 0)
				break;
			on_frame(t, buf, n > (ssize_t)sizeof(buf) ? -1 : n);
		}
		for (int k = 0; k < 256 && fds[1].revents & POLLIN; k++) {
			ssize_t n = recv(t->data_fd, buf, sizeof(buf), MSG_DONTWAIT);
			if (n < 0)
				break;
			on_request(t, buf, n);
		}
		if (client.count)
			flush(&client);
		if (agent.count)
			flush(&agent);
	}
}

static int hexbytes(const char *s, uint8_t *out, size_t n)
{
	if (strlen(s) != 2 * n)
		return -1;
	for (size_t i = 0; i < n; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = v;
	}
	return 0;
}

static void usage(void)
{
	fputs("usage: madtwin serve --data-fd N --fwd-fd N --pkt-fd N --stats-fd N --eth HEX28 "
	      "--ifname IF [--port P] [--timeout-ns NS]\n"
	      "       madtwin frame|reply [--port P]   (test modes: stdin -> hex lines)\n",
	      stderr);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"data-fd", required_argument, 0, 'd'}, {"fwd-fd", required_argument, 0, 'f'},
		{"pkt-fd", required_argument, 0, 'k'},  {"stats-fd", required_argument, 0, 's'},
		{"eth", required_argument, 0, 'e'},     {"ifname", required_argument, 0, 'i'},
		{"port", required_argument, 0, 'p'},    {"timeout-ns", required_argument, 0, 't'},
		{0, 0, 0, 0},
	};
	struct twin t = {.data_fd = -1, .fwd_fd = -1, .pkt_fd = -1, .port = 1, .timeout_ns = 500000000u};
	int stats_fd = -1, have_eth = 0, c;
	if (argc < 2) {
		usage();
		return 2;
	}
	const char *mode = argv[1];
	optind = 2;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'd': t.data_fd = atoi(optarg); break;
		case 'f': t.fwd_fd = atoi(optarg); break;
		case 'k': t.pkt_fd = atoi(optarg); break;
		case 's': stats_fd = atoi(optarg); break;
		case 'e': have_eth = hexbytes(optarg, t.eth, ETH_LEN) == 0; break;
		case 'i': t.ifname = optarg; break;
		case 'p': t.port = atoi(optarg); break;
		case 't': t.timeout_ns = strtoull(optarg, NULL, 10); break;
		default: usage(); return 2;
		}
	}
	crc_init();
	stats = &scratch_stats;
	if (!strcmp(mode, "frame") || !strcmp(mode, "reply"))
		return test_mode(mode, t.port);
	if (strcmp(mode, "serve") || t.data_fd < 0 || t.fwd_fd < 0 || t.pkt_fd < 0 || stats_fd < 0 ||
	    !have_eth || !t.ifname || t.port < 1 || t.port > 254 || !t.timeout_ns) {
		usage();
		return 2;
	}
	/* No PR_SET_PDEATHSIG: it fires when the *thread* that started us ends (the agent host
	 * starts us from a worker thread, which its pool retires when idle). The agent host's
	 * end of --fwd-fd is the tie: it closes when that process ends, however it ends. */
	stats = mmap(NULL, sizeof(*stats), PROT_READ | PROT_WRITE, MAP_SHARED, stats_fd, 0);
	if (stats == MAP_FAILED) {
		perror("madtwin: mmap of --stats-fd");
		return 1;
	}
	stats->magic = STATS_MAGIC;
	stats->pid = getpid();
	return serve(&t);
}
