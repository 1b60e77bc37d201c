"""Hypothesis profiles for the core property tests.

``cdc-ci`` (default) keeps the unit core suite well under a minute; set
``CDC_HYPOTHESIS_PROFILE=cdc-thorough`` (or ``thorough``) for a long run. Tests use
:func:`cases` instead of loading a global profile, so other suites keep their own settings.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True)
settings.register_profile("cdc-ci", max_examples=1000, **_COMMON)
settings.register_profile("cdc-thorough", max_examples=20000, **_COMMON)


def profile_name() -> str:
    name = os.environ.get("CDC_HYPOTHESIS_PROFILE", "cdc-ci")
    return name if name.startswith("cdc-") else f"cdc-{name}"


def cases(scale: float = 1.0) -> settings:
    """Settings for one property test: the active profile, ``scale`` times its examples."""
    base = settings.get_profile(profile_name())
    return settings(base, max_examples=max(10, int(base.max_examples * scale)))
