"""Shared test settings: deterministic hypothesis runs sized for a 2-core CI machine, and the
``endpoint`` fixture: a real S3-compatible server (moto) per test module, its URL in ``AWS_ENDPOINT_URL``.

``ZEPHON_HYPOTHESIS_PROFILE=deep`` runs random (not derandomized) examples, four times as many.
"""
import os

import pytest
from hypothesis import HealthCheck, settings
from s3_server import KEYS, start_server

settings.register_profile(
    "zephon", deadline=None, derandomize=True, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile("deep", parent=settings.get_profile("zephon"), derandomize=False, max_examples=250)
settings.load_profile(os.environ.get("ZEPHON_HYPOTHESIS_PROFILE", "zephon"))


@pytest.fixture(scope="module")
def endpoint():
    server, url = start_server()
    saved = {k: os.environ.get(k) for k in (*KEYS, "AWS_ENDPOINT_URL")}
    os.environ.update(KEYS, AWS_ENDPOINT_URL=url)
    yield url
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()
