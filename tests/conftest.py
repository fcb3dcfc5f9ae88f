"""Shared test settings: deterministic hypothesis runs sized for a 2-core CI machine.

``ZEPHON_HYPOTHESIS_PROFILE=deep`` runs random (not derandomized) examples, four times as many.
"""
import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "zephon", deadline=None, derandomize=True, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("deep", parent=settings.get_profile("zephon"), derandomize=False, max_examples=250)
settings.load_profile(os.environ.get("ZEPHON_HYPOTHESIS_PROFILE", "zephon"))
