from . import envelope as envelope
from . import image as image

__all__ = ["__version__", "envelope", "image"]

__version__: str
