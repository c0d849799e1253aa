"""Exceptions that carry a user-facing one-line message."""


class ConfigError(ValueError):
    """A user mistake in a config or on the command line: printed as one line, exit code 2."""
