"""Single-process training of the batched algorithms (HA2C, HDDPG) on batched envs."""
