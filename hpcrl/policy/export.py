"""A run's policy as one file that plain PyTorch (or an ONNX runtime) loads: ``hpcrl export``.

:class:`DeployedPolicy` puts around the run's model what the actors do around it: raw observations
are standardised with the checkpoint's statistics exactly as the sampler does (float64
``(obs - mean) / sqrt(var + 1e-8)``, clipped to ``env.clip``, then float32), the algorithm's greedy
action is taken (``algo.greedy``, as evaluation episodes), and Box actions are clipped into the
action space, or rescaled onto it with ``env.rescale_actions``. The output is the action the env
takes. :func:`trace` records it with ``torch.jit.trace`` (the models build torch.distributions
objects, which ``torch.jit.script`` does not compile) and checks the traced module against the
eager one on a batch of another size, so a trace that baked in a batch size is refused.

Multi-policy (MARL) models: the input rows come in whole env copies, row r is agent r mod A
(as the actors step them); the agent -> policy map of the checkpoint is baked in.

ONNX is exported from the traced module with ``torch.onnx.export(..., dynamo=False)`` (the
TorchScript-based exporter, which needs only the ``onnx`` package and takes well under a second;
the torch.export-based one needs onnxscript as well and took 16 s for a two-layer MLP here).

Next to the file a JSON (its name + ``.json``) records the env id, the spaces, the input and
output, the folded statistics, the algorithm, the hpcrl version and the checkpoint's version.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from hpcrl.errors import ConfigError

FORMATS = ("torchscript", "onnx")
SUFFIX = {"torchscript": ".pt", "onnx": ".onnx"}
NORM_EPS = 1e-8
"""The sampler's variance epsilon (hpcrl.runtime.roles.sampler.VectorSampler._norm_obs)."""
METADATA_FORMAT = 1


class DeployedPolicy(nn.Module):
    """Raw observations [B, *obs_shape] -> the greedy action as the env takes it [B, *action_shape]."""

    def __init__(self, policy) -> None:
        super().__init__()
        sampler = policy.sampler
        self.model = policy.model
        self._greedy = policy.algo.greedy  # a bound method, not a submodule: only its tensor operations are traced
        self.raw_uint8 = np.dtype(sampler.obs_dtype) == np.uint8  # frames that stay uint8 (not normalised)
        self.normalize = sampler.obs_rms is not None
        if self.normalize:
            rms = sampler.obs_rms
            self.register_buffer("obs_mean", torch.as_tensor(rms.mean, dtype=torch.float64))
            self.register_buffer("obs_std", torch.sqrt(torch.as_tensor(rms.var, dtype=torch.float64) + NORM_EPS))
            self.clip = float(sampler.clip)
        self.action_map = action_map(sampler)
        if not sampler.discrete:
            self.register_buffer("low", torch.as_tensor(sampler.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(sampler.high, dtype=torch.float32))

    def forward(self, obs: Tensor) -> Tensor:
        x = obs if self.raw_uint8 else obs.to(torch.float32)
        if self.normalize:
            z = (x.to(torch.float64) - self.obs_mean) / self.obs_std
            x = z.clamp(-self.clip, self.clip).to(torch.float32)
        a = self._greedy(self.model, x)
        if self.action_map == "rescale":
            return self.low + (self.high - self.low) * (a.clamp(-1.0, 1.0) + 1.0) / 2.0
        if self.action_map == "clip":
            return torch.clamp(a, self.low, self.high)
        return a


def _quiet_jit_deprecation() -> None:
    """torch 2.13 deprecates torch.jit (trace, save, load) in favour of torch.export; TorchScript is still what
    a plain ``torch.jit.load`` reads, so the warning is not the user's business here."""
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)


def action_map(sampler) -> str:
    """How the actors turn the policy's action into the env's: 'discrete', 'clip' (into the Box) or 'rescale'."""
    return "discrete" if sampler.discrete else "rescale" if sampler.rescale else "clip"


def observations(policy, rows: int, seed: int = 0) -> np.ndarray:
    """``rows`` observations drawn from the observation space (a batch to trace and check on)."""
    space = policy.env.observation_space
    space.seed(seed)
    return np.stack([space.sample() for _ in range(rows)])


def _batch_rows(policy) -> tuple[int, int]:
    """Two batch sizes, whole env copies for a parallel env (rows r are agent r mod A)."""
    agents = len(policy.agents or [1])
    return 2 * agents, 3 * agents


def trace(policy) -> torch.jit.ScriptModule:
    """The traced :class:`DeployedPolicy`, checked against the eager module on a batch of another size."""
    module = DeployedPolicy(policy).eval()
    rows, other = _batch_rows(policy)
    example = torch.as_tensor(observations(policy, rows))
    with torch.no_grad(), warnings.catch_warnings():
        # a MARL model's policies in use become constants of the trace: the map is fixed in the export
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        _quiet_jit_deprecation()
        traced = torch.jit.trace(module, (example,), check_trace=False)
        check = torch.as_tensor(observations(policy, other, seed=1))
        want, got = module(check), traced(check)
    if want.shape != got.shape or want.dtype != got.dtype or not torch.equal(want, got):
        raise RuntimeError(f"export: the traced {type(policy.model).__name__} gives other actions than the model on "
                           f"{other} rows (traced on {rows}); it cannot be exported by tracing")
    return traced


def _values(a: np.ndarray) -> Any:
    """A space bound as JSON: one number when all are equal, else nested lists; +-inf as "inf" / "-inf"."""
    a = np.asarray(a, dtype=np.float64)
    as_json = np.vectorize(lambda v: v if np.isfinite(v) else ("inf" if v > 0 else "-inf"), otypes=[object])
    if a.size and np.all(a == a.flat[0]):
        return as_json(a.flat[0]).item()
    return as_json(a).tolist()


def space_json(space: spaces.Space) -> dict[str, Any]:
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": _values(space.low), "high": _values(space.high)}
    return {"type": type(space).__name__, "repr": str(space)}


def metadata(policy, path: Path, fmt: str) -> dict[str, Any]:
    """What the JSON beside an exported policy says."""
    import hpcrl

    cfg, sampler, state = policy.cfg, policy.sampler, policy.state
    obs_shape = list(policy.env.observation_space.shape)
    action_shape = [] if sampler.discrete else list(sampler.action_shape)
    mapping = {"discrete": "the index of the most likely action",
               "clip": "the Gaussian mean clipped to the action space's [low, high]",
               "rescale": "the Gaussian mean clipped to [-1, 1] and mapped linearly onto [low, high] "
                          "(env.rescale_actions)"}
    agents = policy.agents
    steps = state.get("env_steps")
    return {
        "format": METADATA_FORMAT,
        "file": path.name,
        "file_format": fmt,
        "hpcrl_version": hpcrl.__version__,
        "torch_version": torch.__version__,
        "algorithm": cfg.algo.name,
        "env": {"id": cfg.env.id, "kind": policy.kind, "kwargs": cfg.env.kwargs},
        "checkpoint": {"source": policy.checkpoint, "format": state.get("format"), "version": policy.version,
                       "env_steps": int(steps) if steps is not None else None},
        "observation_space": space_json(policy.env.observation_space),
        "action_space": space_json(policy.env.action_space),
        "input": {"name": "obs", "shape": ["batch", *obs_shape],
                  "dtype": "uint8" if np.dtype(sampler.obs_dtype) == np.uint8 else "float32",
                  "meaning": "raw observations as the env returns them" +
                             (f"; rows in whole env copies, row r is agent r mod {len(agents)}" if agents else "")},
        "output": {"name": "action", "shape": ["batch", *action_shape],
                   "dtype": "int64" if sampler.discrete else "float32",
                   "meaning": f"the greedy action as the env takes it: {mapping[action_map(sampler)]}"},
        "observation_normalization": None if sampler.obs_rms is None else {
            "folded": True, "actor": policy.normalizer_actor,
            "formula": "clip((obs - mean) / sqrt(var + eps), -clip, clip)",
            "mean": sampler.obs_rms.mean.tolist(), "var": sampler.obs_rms.var.tolist(), "eps": NORM_EPS,
            "clip": float(sampler.clip)},
        "agents": None if not agents else {"names": agents, "policy_of": policy.policy_of()},
    }


def metadata_path(path: Path) -> Path:
    """The JSON beside an exported file: its name + .json (policy.pt.json), so a .pt and an .onnx keep their own."""
    return path.with_name(path.name + ".json")


def default_output(run_dir: Path, fmt: str) -> Path:
    return Path(run_dir) / "export" / f"policy{SUFFIX[fmt]}"


def export_policy(policy, out: str | Path | None = None, fmt: str = "torchscript") -> tuple[Path, Path]:
    """Write ``policy`` as ``fmt`` to ``out`` (a file name with a suffix, or a folder to hold policy.pt /
    policy.onnx) and the JSON beside it; (file, JSON file)."""
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt}: allowed: {', '.join(FORMATS)}")
    path = default_output(policy.run_dir, fmt) if out is None else Path(out)
    if path.is_dir() or not path.suffix:  # a folder, or a name without a suffix: a folder to write into
        path = path / f"policy{SUFFIX[fmt]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    traced = trace(policy)
    if fmt == "torchscript":
        with warnings.catch_warnings():
            _quiet_jit_deprecation()
            torch.jit.save(traced, str(path))
    else:
        write_onnx(traced, torch.as_tensor(observations(policy, _batch_rows(policy)[0])), path)
    meta = metadata_path(path)
    meta.write_text(json.dumps(metadata(policy, path, fmt), indent=2) + "\n", encoding="utf-8")
    return path, meta


def write_onnx(traced: torch.jit.ScriptModule, example: Tensor, path: Path) -> None:
    """The traced policy as ONNX, the batch dimension dynamic; one-line ConfigError where it cannot be."""
    try:
        import onnx  # noqa: F401 - torch.onnx's exporter needs it
    except ImportError:
        raise ConfigError("--format onnx needs the onnx package (pip install 'hpcrl[export]'); "
                          "--format torchscript needs nothing more") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript-based exporter: see the module doc
            warnings.filterwarnings("ignore", message="no signature found")  # a traced module's forward has none
            torch.onnx.export(traced, (example,), str(path), dynamo=False, input_names=["obs"],
                              output_names=["action"], dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}})
    except Exception as exc:  # noqa: BLE001 - an operator ONNX lacks, a torch without the exporter ...
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--format onnx: torch.onnx could not export this policy ({type(exc).__name__}: {text}); "
                          "--format torchscript exports every model") from None
