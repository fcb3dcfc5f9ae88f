"""Shared test settings: deterministic hypothesis runs sized for a 2-core CI machine."""


from hypothesis import HealthCheck, settings

settings.register_profile(
    "zephon", deadline=None, derandomize=True, max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile("zephon")

