"""The one error the HDF5 record raises at users."""
from __future__ import annotations

from hpcrl.errors import ConfigError


class RunFileError(ConfigError):
    """A run file that is missing, truncated, foreign or from another schema: one line naming
    the file and what is missing (a ConfigError, so the CLI prints it and exits 2)."""
