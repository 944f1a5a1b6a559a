from . import cip as cip
from . import envelope as envelope
from . import image as image
from . import signal as signal

__all__ = ["__version__", "cip", "envelope", "image", "signal"]

__version__: str
