"""Parsl configs, one small file per site; each Parsl app is one MPI job (MPIExecutor + SimpleLauncher).

Every module here has ``config(**settings) -> parsl.Config``. Machine facts (cores, GPUs, file
systems) come from the site's YAML in ``hpcrl/sites/``, as for the batch scripts. Building a
config reads that file and nothing else: it runs no command, writes no file and makes no network
request: Parsl's SlurmProvider runs ``sacct`` in its constructor and HighThroughputExecutor looks
up addresses (one of them over the internet) when none is given, so the Slurm sites use
:class:`DeferredSlurmProvider` and every site passes an explicit ``address``. Copy a file, fill
in ``YOUR_ACCOUNT``, and pass your own settings.
"""
from __future__ import annotations

import importlib

from hpcrl.errors import ConfigError

SITES = {
    "local": "local",
    "local-slurm": "local_cluster",
    "local-cluster": "local_cluster",
    "perlmutter": "perlmutter",
    "polaris": "polaris",
    "aurora": "aurora",
}
"""Workflow --site name -> module in this package."""

BATCH_SITE = {"local": None, "local-slurm": "local-slurm", "local-cluster": "local-cluster",
              "perlmutter": "perlmutter-gpu", "polaris": "polaris", "aurora": "aurora"}
"""Workflow site -> its facts, hpcrl/sites/NAME.yaml: the rank layout, launcher options, rank environment
and container setup of its apps (None: all ranks on this machine)."""


def make_config(site: str, **settings):
    """The Parsl config of ``site`` with ``settings`` passed to its factory."""
    if site not in SITES:
        raise ConfigError(f"--site: unknown Parsl site {site!r}; known: {', '.join(SITES)}")
    module = importlib.import_module(f"{__name__}.{SITES[site]}")
    try:
        return module.config(**settings)
    except TypeError as exc:  # an unknown setting for this site
        raise ConfigError(f"--site {site}: {exc}") from None


def interface_address(interface: str) -> str:
    """The IPv4 address of a local network interface (a local query; no traffic)."""
    from parsl.addresses import address_by_interface

    try:
        return address_by_interface(interface)
    except OSError:
        raise ConfigError(f"address: this machine has no network interface {interface!r}; run the workflow on the "
                          "site's login node, or pass address=IP reachable from the compute nodes") from None
