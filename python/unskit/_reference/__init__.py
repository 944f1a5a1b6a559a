"""Pure-Python twins of the Rust kernels: test oracles, never the fast path.

Each twin restates its kernel's rule in the plainest Python there is; the parity tests
(`tests/signal`, `tests/cip`) run both on random inputs and require the same answers,
floats bit for bit.
"""
