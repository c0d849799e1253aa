"""The one container wrapper: apptainer, podman-hpc and shifter (hybrid MPI model: launcher outside)."""
import pytest

from hpcrl.config import ContainerConfig
from hpcrl.errors import ConfigError
from hpcrl.launch_container import container_prefix, wrap

RANK = ["/venv/bin/python", "-m", "hpcrl.runtime.runners.mpi", "/scratch/run", "--progress=plain", "--resume"]


def box(**kw):
    return ContainerConfig(**{"image": "/images/hpcrl.sif", **kw})


def test_apptainer_exec_with_gpus_and_binds():
    cmd = wrap(RANK, box(gpu=True, binds=["/scratch", "/data:/mnt/data:ro"]), extra_binds=["/scratch", "/opt"])
    assert cmd == ["apptainer", "exec", "--nv", "--bind", "/scratch", "--bind", "/data:/mnt/data:ro",
                   "--bind", "/opt", "/images/hpcrl.sif",
                   "python3", "-m", "hpcrl.runtime.runners.mpi", "/scratch/run", "--progress=plain", "--resume"]


def test_podman_hpc_run_passes_mpi_gpu_volumes_and_rank_environment():
    cmd = container_prefix(box(runtime="podman-hpc", image="registry.nersc.gov/m1/hpcrl:0.1", gpu=True,
                               binds=["/pscratch/sd/m/me"]))
    assert cmd[:5] == ["podman-hpc", "run", "--rm", "--mpi", "--gpu"]
    assert cmd[5:7] == ["-v", "/pscratch/sd/m/me:/pscratch/sd/m/me"]
    assert ["-e", "HDF5_USE_FILE_LOCKING"] == cmd[7:9] and cmd[-1] == "registry.nersc.gov/m1/hpcrl:0.1"


def test_shifter_loads_the_mpich_module_and_gpu_when_asked():
    assert container_prefix(box(runtime="shifter", image="docker:me/hpcrl:0.1")) == [
        "shifter", "--image=docker:me/hpcrl:0.1", "--module=mpich"]
    assert container_prefix(box(runtime="shifter", image="docker:me/hpcrl:0.1", gpu=True))[2] == "--module=mpich,gpu"


def test_wrapped_commands_start_with_the_image_python():
    podman = wrap(["py", "-m", "m"], box(runtime="podman-hpc", image="img", binds=["/a"]))
    assert podman == ["podman-hpc", "run", "--rm", "--mpi", "-v", "/a:/a", "-e", "HDF5_USE_FILE_LOCKING",
                      "-e", "OMP_NUM_THREADS", "-e", "PYTHONUNBUFFERED", "img", "python3", "-m", "m"]
    shifter = wrap(["py", "-m", "m"], box(runtime="shifter", image="img:1"))
    assert shifter == ["shifter", "--image=img:1", "--module=mpich", "python3", "-m", "m"]


def test_no_container_leaves_the_command_alone():
    assert wrap(RANK, None) == RANK


@pytest.mark.parametrize("kw, field", [
    ({"image": "x.sif --bind /:/host"}, "image"),
    ({"image": "-x"}, "image"),
    ({"binds": ["relative/path"]}, "binds"),
    ({"binds": ["/a,/etc"]}, "binds"),
    ({"binds": ["/a:/b:rwx"]}, "binds"),
])
def test_bad_images_and_binds_are_one_line_errors(kw, field):
    with pytest.raises(ConfigError, match=f"launch.container.{field}") as info:
        container_prefix(box(**kw))
    assert "\n" not in str(info.value)
