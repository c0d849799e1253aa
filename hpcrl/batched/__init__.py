"""The fused single-device loop (seed 003): :mod:`hpcrl.batched.runner`; :func:`fuses` says when it runs."""
from __future__ import annotations


def fuses(cfg) -> bool:
    """True when the serial runner fuses the roles into one device loop: algo ha2c or hddpg on a batched
    tensor env with one actor and one learner group and no evaluation episodes (otherwise the roles
    run as usual: the fused loop has no actor to evaluate on)."""
    from hpcrl.envs import registry

    spec = registry.spec(cfg.env.id)
    return (cfg.launch.runner == "serial" and cfg.algo.fused_loop and spec is not None
            and spec.kind == "batched" and cfg.actors.count == 1 and cfg.learners.groups == 1
            and cfg.eval.episodes == 0)
