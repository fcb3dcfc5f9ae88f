from hypothesis import settings

settings.register_profile("ci", derandomize=True, deadline=None, max_examples=30, database=None)
settings.load_profile("ci")
