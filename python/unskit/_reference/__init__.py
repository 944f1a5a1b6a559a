"""Pure-Python twins of the Rust kernels: test oracles, never the fast path."""
