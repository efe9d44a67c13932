"""The subnet manager: discovery, LIDs, routing engines, programming, traps and reroute."""
