"""A running fabric: plan it from a topology, build it in the kernel, run its agents, tear it down."""
