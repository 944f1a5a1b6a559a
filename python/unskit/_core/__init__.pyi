from . import cip as cip
from . import envelope as envelope
from . import image as image
from . import signal as signal
from . import tls as tls

__all__ = ["__version__", "cip", "envelope", "image", "signal", "tls"]

__version__: str
