"""Environments: the registry a config names them through, and hpcrl's own environments."""
from hpcrl.envs.registry import check_env_id, hpcrl_env_ids, import_env_modules, make, register, spec

__all__ = ["check_env_id", "hpcrl_env_ids", "import_env_modules", "make", "register", "spec"]
