"""RoCEv2 fabrics: IP routers in namespaces, a fabric manager installing ECMP routes, and
``RocePort``, the HCA transport behind Ethernet / IPv4 / UDP 4791.

- ``addressing``: the IPv4 plan (198.18.0.0/15 only) and the LID <-> IP table (pure);
- ``routes``: shortest-path ECMP routes and their diffs (pure);
- ``netconf``: what a router or host namespace needs from the kernel (sysctls, addresses,
  static neighbours, routes, the host's ingress guard);
- ``fabric``: build and tear down a live RoCE fabric on ibemu's kernel substrate;
- ``manager``: the fabric manager process (``python -m ibemu.roce.fabric_manager``);
- ``codec``: native IB packet <-> RoCEv2 frame (sans-IO, ICRC per IBA annex A16);
- ``port``: ``RocePort``, the RoCEv2 counterpart of ``ibemu.hca.nic.HcaPort``;
- ``runtime``: a RoCE fabric for ``ibemu run`` (``fabric: {kind: roce}``) and its fault injector.
"""
