"""Search algorithms as pure ask/tell objects behind one interface (no I/O, no clocks)."""
