"""Registers the core hypothesis profiles (see hyp.py): ``CDC_HYPOTHESIS_PROFILE=thorough``."""

from . import hyp  # noqa: F401 - registers the profiles
