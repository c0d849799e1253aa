"""The fused single-device loop (seed 003): :mod:`hpcrl.batched.runner`; :func:`fuses` says when it runs."""
from __future__ import annotations


def fuses(cfg) -> bool:
    """True when the serial runner fuses the roles into one device loop: algo ha2c or hddpg on a batched
    tensor env with one actor and one learner group and no evaluation episodes (otherwise the roles
    run as usual: the fused loop has no actor to evaluate on)."""
    return cfg.algo.fused_loop and not why_not_fused(cfg)


def why_not_fused(cfg) -> str:
    """For an algorithm the fused loop runs: why this config runs it on the roles instead ('' when it fuses)."""
    from hpcrl.envs import registry

    spec = registry.spec(cfg.env.id)
    for reason, holds in (
            (f"launch.runner={cfg.launch.runner}", cfg.launch.runner != "serial"),
            (f"env.id={cfg.env.id} is not a batched tensor env", spec is None or spec.kind != "batched"),
            (f"actors.count={cfg.actors.count}", cfg.actors.count != 1),
            (f"learners.groups={cfg.learners.groups}", cfg.learners.groups != 1),
            (f"eval.episodes={cfg.eval.episodes}: the fused loop has no actor to evaluate on", cfg.eval.episodes != 0)):
        if holds:
            return reason
    return ""
