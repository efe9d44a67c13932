"""The only code that touches the kernel: namespaces, veth links, tc, packet and netlink
sockets, eBPF, timerfd, /proc and /sys, ownership.

pyroute2's sync API and the ``ip``/``tc`` subprocesses block: call them before ``trio.run``
or through ``trio.to_thread.run_sync``, never on the trio thread.
"""
