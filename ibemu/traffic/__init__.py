"""Traffic over HCA ports: perftest-like tests, collectives, sequence-numbered streams.

``flows`` holds ``TRAFFIC_KINDS``, the one registry of traffic kinds a scenario may name;
``worker`` is the process that runs a scenario's flows on the hosts' cables; ``blackout``
turns delivery records into what a fault did to a flow; ``endpoints`` finds and opens hosts'
ports on a running fabric; ``oob`` is the out-of-band exchange of two ``ibemu perf`` sides.
"""
