from . import cip as cip
from . import envelope as envelope
from . import signal as signal

__all__ = ["__version__", "cip", "envelope", "signal"]

__version__: str
