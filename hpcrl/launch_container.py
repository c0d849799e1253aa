"""The one container wrapper: the host launcher starts one container per rank (hybrid MPI model).

``wrap(rank_argv, container, binds)`` puts ``container_prefix`` between the launcher and the rank's
command (:func:`hpcrl.launch.rank_command` calls it for local runs, batch scripts and Parsl apps)::

    srun -n 8 | apptainer exec --nv --bind /scratch IMAGE                | python3 -m hpcrl.runtime.runners.mpi RUN_DIR ...
    srun -n 8 | podman-hpc run --rm --mpi --gpu -v /scratch:/scratch IMAGE | python3 -m hpcrl.runtime.runners.mpi ...
    srun -n 8 | shifter --image=IMAGE --module=mpich,gpu                 | python3 -m hpcrl.runtime.runners.mpi ...

The MPI inside the image must be MPICH (ABI compatible with Cray MPICH, which the site swaps in:
ALCF via ``cray-mpich-abi``, NERSC via ``podman-hpc --mpi`` / ``shifter --module=mpich``); see
singularity/hpcrl.def. Pure string work: nothing here runs a container.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from hpcrl.config import ContainerConfig
from hpcrl.errors import ConfigError

RANK_PYTHON = "python3"
"""The interpreter inside hpcrl's images (hpcrl is installed into the OS Python)."""

PASS_ENV = ("HDF5_USE_FILE_LOCKING", "OMP_NUM_THREADS", "PYTHONUNBUFFERED")
"""Variables a rank needs from the host; apptainer and shifter pass the environment through, podman does not."""

_PATH = r"/[A-Za-z0-9_./@+=-]*"
_BIND = re.compile(rf"^{_PATH}(:{_PATH}(:(ro|rw))?)?$")
_IMAGE = re.compile(r"^[A-Za-z0-9_./@:+=-]+$")


def check_image(image: str) -> str:
    if not _IMAGE.match(image) or image.startswith("-"):
        raise ConfigError(f"launch.container.image: {image!r} is not a plain image path or name "
                          "(allowed: letters, digits and _ . / @ : + = -)")
    return image


def check_bind(bind: str) -> str:
    if not _BIND.match(bind):
        raise ConfigError(f"launch.container.binds: {bind!r} is not SRC[:DST[:ro|rw]] with absolute paths "
                          "(allowed in paths: letters, digits and _ . / @ + = -)")
    return bind


def container_prefix(container: ContainerConfig, extra_binds: Iterable[str] = ()) -> list[str]:
    """The words that start one rank inside ``container``; the rank's own command follows them.

    ``extra_binds`` are host paths the job needs inside the container too (the run directory);
    apptainer and podman-hpc only see what is bound, shifter mounts what its volumes name.
    """
    image = check_image(container.image)
    binds: list[str] = []
    for b in [*container.binds, *extra_binds]:
        if check_bind(b) not in binds:
            binds.append(b)
    if container.runtime == "apptainer":
        words = ["apptainer", "exec"]
        if container.gpu:
            words.append("--nv")  # NVIDIA driver libraries and devices
        for b in binds:
            words += ["--bind", b]
        return [*words, image]
    if container.runtime == "podman-hpc":
        words = ["podman-hpc", "run", "--rm", "--mpi"]  # --mpi: the site's Cray MPICH and PMI into the image
        if container.gpu:
            words.append("--gpu")
        for b in binds:
            src, _, rest = b.partition(":")
            words += ["-v", f"{src}:{rest or src}"]
        for name in PASS_ENV:
            words += ["-e", name]  # a bare name copies the host's value
        return [*words, image]
    if container.runtime == "shifter":
        modules = "mpich,gpu" if container.gpu else "mpich"  # mpich: Cray MPICH replaces the image's MPICH
        words = ["shifter", f"--image={image}", f"--module={modules}"]
        for b in binds:
            src, _, rest = b.partition(":")
            words.append(f"--volume={src}:{rest or src}")
        return words
    raise ConfigError(f"launch.container.runtime: {container.runtime!r}; allowed: apptainer, podman-hpc, shifter")


def wrap(command: list[str], container: ContainerConfig | None, extra_binds: Iterable[str] = ()) -> list[str]:
    """``command`` (``python -m ...``) run in the container, with the image's Python; unchanged without one."""
    if container is None:
        return list(command)
    return [*container_prefix(container, extra_binds), RANK_PYTHON, *command[1:]]
