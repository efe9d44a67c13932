"""RoCEv2 fabrics: the fabric manager and the user datapath's router logic.

- ``addressing``: the IPv4 plan (198.18.0.0/15 only) and the LID <-> IP table (pure);
- ``routes``: shortest-path ECMP routes and their diffs (pure);
- ``fabric_manager``: the fabric manager process (``python -m ibemu.roce.fabric_manager``),
  the IB subnet manager's counterpart: watches links, installs ECMP routes;
- ``userplane``: one user-datapath router's forwarding, sans-IO; ``queues``: the datapath's
  queue settings; ``physics`` and ``links``: its routers' egress queues, line rates, ECN and
  PFC in the link model (``ibemu.physics``, the IB user datapath's, with the IO both share in
  ``ibemu.kernel.linkio``); ``userpath``: every router's forwarder in one trio process.

Elsewhere by role: the RoCEv2 codec and PFC frames in ``ibemu.wire``, ``RocePort`` and DCQCN
in ``ibemu.hca``, the kernel configuration (addresses, routes, impairments, ECN marking) in
``ibemu.kernel``, building a live RoCE fabric in ``ibemu.fabric.roce_fabric``.
"""
