"""A user's own package, as far as the tests are concerned: envs.py registers a Gymnasium id at import."""
