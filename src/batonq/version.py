"""batonq's version: pyproject.toml holds it; the installed package's metadata
carries it."""

from importlib.metadata import version

__all__ = ["VERSION"]

VERSION = version("batonq")
