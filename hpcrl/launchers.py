"""One launcher object per way hpcrl starts MPI ranks: local mpiexec, srun, PALS mpiexec, Parsl's prefix.

As in Parsl (``parsl/launchers``), a launcher is a small object that holds what is fixed for a
machine (which mpiexec, srun's MPI plugin) and is called with what varies per job:
``launcher(command, ranks, ranks_per_node, cpus_per_rank) -> str`` is the shell line that starts
``command`` on every rank. Parsl's launchers take ``tasks_per_node`` and ``nodes_per_block``
because a block is whole nodes of workers; a run's ranks need not fill its last node (10 ranks
at 4 per node), so these take the total. ``prefix(...)`` is that line without the command (the
batch templates put the command on the next line); ``words(...)`` are its words (the argv of the
local launcher, which runs without a shell).

``hpcrl run`` (``hpcrl.launch.local_command``), the batch scripts of ``hpcrl submit`` and the
ClusterEnv worker job (``slurm_templates/``, which print the prefix they are given) and the Parsl
apps (``hpcrl.parsl_runs``) take their launch line from here. Pure string work;
:class:`LocalMpiexec` asks ``os.cpu_count()`` when called, nothing else looks outside.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcrl.sites import Site


class ShellWord(str):
    """A word the shell expands when the script runs (``"$PBS_NODEFILE"``): written as is, never quoted."""


NODEFILE = ShellWord('"$PBS_NODEFILE"')
PARSL_PREFIX = ShellWord("$PARSL_MPI_PREFIX")  # unquoted: the shell splits it into Parsl's srun/mpiexec words


def shell_line(words: list[str]) -> str:
    """``words`` as shell text: each quoted with shlex.quote, except :class:`ShellWord` s."""
    return " ".join(w if isinstance(w, ShellWord) else shlex.quote(w) for w in words)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_layout(kind: str, ranks: int | ShellWord, ranks_per_node: int, cpus_per_rank: int | None) -> None:
    """One-line ValueError naming what is allowed, for a layout no launcher can start. ``ranks`` may be a
    :class:`ShellWord` the script sets when it runs (a job whose node count varies)."""
    if isinstance(ranks, ShellWord):
        if not _count(ranks_per_node):
            raise ValueError(f"{kind}: ranks_per_node={ranks_per_node!r}; allowed: an int of 1 or more")
    elif not _count(ranks):
        raise ValueError(f"{kind}: ranks={ranks!r}; allowed: an int of 1 or more")
    elif not _count(ranks_per_node) or ranks_per_node > ranks:
        raise ValueError(f"{kind}: ranks_per_node={ranks_per_node!r}; allowed: an int from 1 to ranks ({ranks})")
    if cpus_per_rank is not None and not _count(cpus_per_rank):
        raise ValueError(f"{kind}: cpus_per_rank={cpus_per_rank!r}; allowed: None (no binding) or an int of 1 or more")


class Launcher:
    """What every launcher below does with its :meth:`words`."""

    kind = "launcher"

    def words(self, ranks: int, ranks_per_node: int, cpus_per_rank: int | None = None) -> list[str]:
        raise NotImplementedError

    def prefix(self, ranks: int, ranks_per_node: int, cpus_per_rank: int | None = None) -> str:
        """The launch line without the command: shell text, every value quoted."""
        return shell_line(self.words(ranks, ranks_per_node, cpus_per_rank))

    def __call__(self, command: str, ranks: int, ranks_per_node: int, cpus_per_rank: int | None = None) -> str:
        """The shell line starting ``command`` (shell text, e.g. ``"${RANK_ARGS[@]}"``) on every rank."""
        return f"{self.prefix(ranks, ranks_per_node, cpus_per_rank)} {command}"


FLAVOURS = ("mpich", "openmpi", "unknown")


@dataclass(frozen=True)
class LocalMpiexec(Launcher):
    """``mpiexec -n N [--oversubscribe] ARGS...`` on this machine (``hpcrl run``).

    MPICH's Hydra places any number of ranks on a small machine; Open MPI needs
    ``--oversubscribe`` when N exceeds the cores.
    """

    mpiexec: str = "mpiexec"
    """Path or name (``hpcrl.launch.find_mpiexec`` picks it)."""
    flavour: str = "unknown"
    """``hpcrl.launch.mpi_flavour(mpiexec)``: mpich, openmpi or unknown."""
    args: tuple[str, ...] = ()
    """launch.mpiexec_args, placed after the rank count."""
    cores: int | None = None
    """This machine's cores; None: ``os.cpu_count()`` when called."""

    kind = "local mpiexec"

    def __post_init__(self):
        if self.flavour not in FLAVOURS:
            raise ValueError(f"{self.kind}: flavour={self.flavour!r}; allowed: {', '.join(FLAVOURS)}")

    def words(self, ranks: int, ranks_per_node: int, cpus_per_rank: int | None = None) -> list[str]:
        """argv words; ``ranks_per_node`` must be ``ranks`` (one machine) and ``cpus_per_rank`` None."""
        check_layout(self.kind, ranks, ranks_per_node, cpus_per_rank)
        if ranks_per_node != ranks:
            raise ValueError(f"{self.kind}: ranks_per_node={ranks_per_node} with ranks={ranks}; allowed: "
                             "ranks_per_node equal to ranks (every rank on this machine)")
        if cpus_per_rank is not None:
            raise ValueError(f"{self.kind}: cpus_per_rank={cpus_per_rank}; allowed: None "
                             "(bind ranks with launch.mpiexec_args)")
        words = [self.mpiexec, "-n", str(ranks)]
        cores = self.cores or os.cpu_count() or 1
        if self.flavour == "openmpi" and ranks > cores and "--oversubscribe" not in self.args:
            words.append("--oversubscribe")
        return words + list(self.args)


SRUN_MPI = re.compile(r"^[a-z][a-z0-9_]*$")
SRUN_GPU_BINDS = ("none", "closest")


@dataclass(frozen=True)
class Srun(Launcher):
    """Slurm's ``srun --ntasks=N [--ntasks-per-node=P] [--cpus-per-task=C --cpu-bind=cores] [--gpu-bind=G]
    [--overcommit] [--mpi=PLUGIN] --kill-on-bad-exit=1``, inside an allocation (a batch job, a Parsl block) that
    names the nodes. ``--kill-on-bad-exit=1`` (in :meth:`words`, not in the :meth:`options` Parsl appends): a
    node's ranks killed (``srun: error: node2: tasks 4-5: Killed``) end the step at once, whatever the cluster's
    KillOnBadExit, instead of leaving the other ranks to wait for them until the watchdog
    (``launch.watchdog_seconds``); the batch script then names the node and requeues without it (_slurm.sh.j2)."""

    mpi: str | None = None
    """--mpi=PLUGIN (pmi2 for the PyPI mpich wheel); None: the cluster's default (cray_shasta on Perlmutter)."""
    overcommit: bool = False
    """More ranks than cores (--overcommit); Slurm then refuses --ntasks-per-node above the cores: none is given."""
    gpu_bind: str | None = None
    """--gpu-bind=G; "none": every rank sees its node's GPUs (a learner takes its node-local rank's)."""

    kind = "srun"

    def __post_init__(self):
        if self.mpi is not None and not SRUN_MPI.match(self.mpi):
            raise ValueError(f"{self.kind}: mpi={self.mpi!r}; allowed: None or a Slurm MPI plugin name "
                             "(lower-case letters, digits, _: pmi2, pmix, cray_shasta)")
        if self.gpu_bind is not None and self.gpu_bind not in SRUN_GPU_BINDS:
            raise ValueError(f"{self.kind}: gpu_bind={self.gpu_bind!r}; allowed: None, {', '.join(SRUN_GPU_BINDS)}")

    def options(self, cpus_per_rank: int | None = None) -> list[str]:
        """Everything after the rank counts (Parsl's srun prefix writes its own counts, then these)."""
        words = [f"--cpus-per-task={cpus_per_rank}", "--cpu-bind=cores"] if cpus_per_rank else []
        if self.gpu_bind:
            words.append(f"--gpu-bind={self.gpu_bind}")
        if self.overcommit:
            words.append("--overcommit")
        if self.mpi:
            words.append(f"--mpi={self.mpi}")
        return words

    def words(self, ranks: int, ranks_per_node: int, cpus_per_rank: int | None = None) -> list[str]:
        check_layout(self.kind, ranks, ranks_per_node, cpus_per_rank)
        per_node = [] if self.overcommit else [f"--ntasks-per-node={ranks_per_node}"]
        ntasks = f"--ntasks={ranks}"
        if isinstance(ranks, ShellWord):  # the script's own count, expanded when it runs
            ntasks = ShellWord(ntasks)
        return ["srun", ntasks, *per_node, *self.options(cpus_per_rank), "--kill-on-bad-exit=1"]


@dataclass(frozen=True)
class PalsMpiexec(Launcher):
    """The Cray PALS ``mpiexec -n N --ppn P [--depth=D --cpu-bind depth] --hostfile "$PBS_NODEFILE"`` of
    PBS Pro at ALCF (Polaris, Aurora); D counts hardware threads. The flags are those of ALCF's Polaris and Aurora
    job guides (``-n``, ``--ppn``, ``--depth``, ``--cpu-bind depth``, ``--hostfile``, whose default is
    $PBS_NODEFILE); a launch on some nodes of the job names them in a hostfile of its own, as ALCF's ensemble
    example does (its Polaris "Multi-node Ensemble Calculations": one ``--hostfile`` per concurrent mpiexec)."""

    hostfile: str = NODEFILE
    """The nodes to start on, one name a line: the job's ($PBS_NODEFILE), or a file naming some of them (a
    joining launch, hpcrl.join_launch)."""

    kind = "PALS mpiexec"

    def __post_init__(self):
        if not isinstance(self.hostfile, str) or not self.hostfile.strip() or "\n" in self.hostfile:
            raise ValueError(f"{self.kind}: hostfile={self.hostfile!r}; allowed: a path, or \"$PBS_NODEFILE\"")

    def options(self, cpus_per_rank: int | None = None) -> list[str]:
        """The binding (Parsl's mpiexec prefix writes its own counts and hosts, then these)."""
        return [f"--depth={cpus_per_rank}", "--cpu-bind", "depth"] if cpus_per_rank else []

    def words(self, ranks: int, ranks_per_node: int, cpus_per_rank: int | None = None) -> list[str]:
        check_layout(self.kind, ranks, ranks_per_node, cpus_per_rank)
        return ["mpiexec", "-n", str(ranks), "--ppn", str(ranks_per_node), *self.options(cpus_per_rank),
                "--hostfile", self.hostfile]


@dataclass(frozen=True)
class ParslMpiPrefix(Launcher):
    """A Parsl MPI app's ``$PARSL_MPI_PREFIX COMMAND``.

    Parsl composes the prefix for the nodes it gives the app (``srun --ntasks N --ntasks-per-node P
    --nodelist ... --nodes K`` or ``mpiexec -n N -ppn P -hosts ...``) from :meth:`resources` (the
    app's ``parsl_resource_specification``), whose ``launcher_options`` end it.
    """

    under: Srun | PalsMpiexec | None = None
    """The launcher behind the executor's mpi_launcher (srun: :class:`Srun`; mpiexec at ALCF:
    :class:`PalsMpiexec`), whose binding options Parsl appends; None: MPICH's Hydra mpiexec on
    this machine, with ``-launcher fork`` (no ssh to the host Parsl names)."""

    kind = "Parsl MPI prefix"

    def __post_init__(self):
        if self.under is not None and not isinstance(self.under, (Srun, PalsMpiexec)):
            raise ValueError(f"{self.kind}: under={self.under!r}; allowed: Srun, PalsMpiexec or None")

    def launcher_options(self, cpus_per_rank: int | None = None) -> str:
        """What Parsl appends to its srun/mpiexec prefix."""
        return shell_line(["-launcher", "fork"] if self.under is None else self.under.options(cpus_per_rank))

    def resources(self, ranks: int, ranks_per_node: int, cpus_per_rank: int | None, nodes: int) -> dict:
        """parsl_resource_specification: num_nodes, ranks_per_node, num_ranks, launcher_options."""
        check_layout(self.kind, ranks, ranks_per_node, cpus_per_rank)
        if not _count(nodes) or nodes * ranks_per_node < ranks:
            raise ValueError(f"{self.kind}: nodes={nodes!r}; allowed: an int of at least ranks / ranks_per_node "
                             f"({-(-ranks // ranks_per_node)})")
        return {"num_nodes": nodes, "ranks_per_node": ranks_per_node, "num_ranks": ranks,
                "launcher_options": self.launcher_options(cpus_per_rank)}

    def words(self, ranks: int, ranks_per_node: int, cpus_per_rank: int | None = None) -> list[str]:
        check_layout(self.kind, ranks, ranks_per_node, cpus_per_rank)
        return [PARSL_PREFIX]


def for_site(site: Site, *, gpus: bool = True) -> Srun | PalsMpiexec:
    """The launcher of ``site``'s jobs (its ``launcher`` fact); ``gpus=False``: a job that asks for
    no GPUs (the ClusterEnv workers), so no --gpu-bind."""
    if site.launcher == "pals":
        return PalsMpiexec()
    if site.launcher == "srun":
        return Srun(mpi=site.srun_mpi, overcommit=site.overcommit,
                    gpu_bind="none" if gpus and site.gpus_per_node else None)
    raise ValueError(f"site {site.name}: launcher={site.launcher!r}; allowed: srun, pals")
