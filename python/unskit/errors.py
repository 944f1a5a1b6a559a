"""The unskit exception tree; every error the library raises on purpose is one of these.

::

    UnskitError
    └── EnvelopeError (also ValueError): bytes that are not a valid envelope,
                                          or content that breaks an envelope rule

The Rust core's errors are mapped to these classes in ``rust/unskit-py/src/errors.rs``.
"""

from __future__ import annotations

__all__ = ["EnvelopeError", "UnskitError"]


class UnskitError(Exception):
    """Root of every error unskit raises on purpose."""


class EnvelopeError(UnskitError, ValueError):
    """Envelope bytes that do not decode, or content that breaks an envelope rule."""
