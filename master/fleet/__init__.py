"""The fleet: leases over tasks, the gRPC edge workers call, and its authentication."""
