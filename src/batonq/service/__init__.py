"""The HTTP service: ``create_app(dsn)``."""

from batonq.service.app import create_app

__all__ = ["create_app"]
