"""Fixtures the unit tests share."""

from .fake_database import fakedb  # noqa: F401 - a fake third database, registered for one test
