from . import envelope as envelope

__all__ = ["__version__", "envelope"]

__version__: str
