"""Link physics, sans-IO: rates, serialization, propagation, switch latency, buffers, IB
credit-based flow control per VL with SL -> VL maps and VL arbitration, RoCE drop tail / PFC /
ECN, and credit-loop detection.

Pure (no trio, no IO; time is emulated ns passed in). ``link`` (cables and switch models),
``qos`` (VL counts, SL -> VL, VL arbitration), ``model`` (nodes, ports, actions), ``deadlock``
(credit loops), ``sim`` (a reference discrete-event driver), ``expect`` (analytic figures),
``bisection`` (flows on routed paths: max-min fair rates, effective bisection).
"""
