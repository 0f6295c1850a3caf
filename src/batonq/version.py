"""batonq's version: the installed package's, which pyproject.toml sets."""

from importlib.metadata import version

__all__ = ["VERSION"]

VERSION = version("batonq")
