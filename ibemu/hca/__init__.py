"""The host side of a CA port: the RDMA transport (sans-IO) and its adapters on real cables.

- ``transport``: RC and UD queue pairs over native IB packets, sans-IO (packets in, packets
  and completions out); ``verbs``: a small verbs-like API over it;
- ``nic``: ``HcaPort``, the transport on a host's AF_PACKET socket (native IB frames);
  ``roce_port``: ``RocePort``, the same behind Ethernet / IPv4 / UDP 4791, with ``dcqcn``;
- ``umad_server`` / ``umad_client``: a port's MAD socket (ibsim's client protocol) and the
  client ibemu's SM attaches with.
"""
