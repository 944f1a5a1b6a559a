from . import cip as cip
from . import envelope as envelope
from . import image as image
from . import journal as journal
from . import signal as signal
from . import tls as tls

__all__ = ["__version__", "cip", "envelope", "image", "journal", "signal", "tls"]

__version__: str
