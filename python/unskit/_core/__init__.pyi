from . import envelope as envelope
from . import signal as signal

__all__ = ["__version__", "envelope", "signal"]

__version__: str
