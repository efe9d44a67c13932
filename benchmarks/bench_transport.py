#!/usr/bin/env python3
"""HCA transport figures: two QPs wired back to back in memory (no kernel, one core).

- RC WRITE 4 KiB, one way: data packets/s through sender build + receiver parse/verify
  (ICRC+VCRC)/place + ACK generation and processing; also each side alone.
- RC SEND 64 B: messages/s including receives, ACKs and CQ polling.
Target (issue 6, with the IO layer): >= 100,000 packets/s per core, aim 200,000.
Run: .venv/bin/python benchmarks/bench_transport.py [--seconds S] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats

from harness import rate  # benchmarks/harness.py

from ibemu.hca.transport import Access, Hca, RecvWr, SendWr, Sge, WrOpcode

MTU = 4096
BATCH = 64


def setup(mtu: int = MTU) -> tuple[Hca, Hca, object, object, object, object, object, object]:
    a, b = Hca(lid=1, mtu=mtu, seed=1), Hca(lid=2, mtu=mtu, seed=2)
    cqa, cqb = a.create_cq(), b.create_cq()
    qa, qb = a.create_rc_qp(cqa), b.create_rc_qp(cqb)
    qa.connect(qb.info(), timeout=18, ack_every=16)
    qb.connect(qa.info(), timeout=18, ack_every=16)
    src = a.reg_mr(bytearray(os.urandom(BATCH * MTU)), Access.LOCAL_WRITE)
    dst = b.reg_mr(bytearray(BATCH * MTU), Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    return a, b, qa, qb, cqa, cqb, src, dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.5, help="time per figure")
    ap.add_argument("--profile", action="store_true", help="cProfile the 4 KiB WRITE loop")
    args = ap.parse_args()
    s = args.seconds
    rows: list[tuple[str, str, str]] = []

    a, b, qa, qb, cqa, cqb, src, dst = setup()
    # 64 one-packet 4 KiB WRITEs per post, every 16th signaled (AckReq every 16 packets too)
    wrs = [SendWr(i, WrOpcode.RDMA_WRITE, [Sge(src.addr + i * MTU, MTU, src.lkey)],
                  remote_addr=dst.addr + i * MTU, rkey=dst.rkey, signaled=i % 16 == 15)
           for i in range(BATCH)]
    a_receive, b_receive, poll = a.receive, b.receive, cqa.poll

    def write_round() -> None:
        for sp in qa.post_send(wrs):
            for ack in b_receive(sp.packet):
                a_receive(ack.packet)
        poll(BATCH)

    write_round()
    assert dst.buf == src.buf
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(lambda: [write_round() for _ in range(500)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    r = rate(write_round, s) * BATCH
    rows.append(("RC WRITE 4 KiB one way (build+verify+place+ACKs)", f"{r:,.0f}", "pkt/s"))
    rows.append(("  CPU per data packet, both ends", f"{1e6 / r:.2f}", "us"))

    pkts = [sp.packet for sp in qa.post_send(wrs)]
    for p in pkts:
        for ack in b_receive(p):
            a_receive(ack.packet)
    first_psn = int.from_bytes(pkts[0][17:20], "big")
    req = qa.req

    def send_only() -> None:
        qa.post_send(wrs)
        req.outstanding.clear()  # nobody acknowledges these: forget them
        req.una = req.next_psn

    r = rate(send_only, s) * BATCH
    rows.append(("  sender only: build 4 KiB WRITE packets", f"{1e6 / r:.2f}", "us/pkt"))

    def replay() -> None:
        qb.resp.epsn = first_psn
        for p in pkts:
            b_receive(p)

    r = rate(replay, s) * BATCH
    rows.append(("  receiver only: verify+place 4 KiB WRITE", f"{1e6 / r:.2f}", "us/pkt"))

    # 64-byte SENDs: 64 per post, every 16th signaled; the receiver reposts its buffers
    a, b, qa, qb, cqa, cqb, src, dst = setup()
    sends = [SendWr(i, WrOpcode.SEND, [Sge(src.addr + i * 64, 64, src.lkey)], signaled=i % 16 == 15)
             for i in range(BATCH)]
    recvs = [RecvWr(i, [Sge(dst.addr + i * 64, 64, dst.lkey)]) for i in range(BATCH)]
    a_receive, b_receive = a.receive, b.receive

    def send_round() -> None:
        for rw in recvs:
            qb.post_recv(rw)
        for sp in qa.post_send(sends):
            for ack in b_receive(sp.packet):
                a_receive(ack.packet)
        cqa.poll(BATCH)
        cqb.poll(BATCH)

    send_round()
    r = rate(send_round, s) * BATCH
    rows.append(("RC SEND 64 B (post_recv+send+ACKs+poll)", f"{r:,.0f}", "msg/s"))
    rows.append(("  CPU per message, both ends", f"{1e6 / r:.2f}", "us"))

    w = max(len(n) for n, _v, _u in rows)
    for name, value, unit in rows:
        print(f"{name:<{w}}  {value:>12} {unit}")


if __name__ == "__main__":
    main()
