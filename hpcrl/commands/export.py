"""`hpcrl export RUN_DIR`: write a run's checkpointed policy as a TorchScript (or ONNX) file that needs no hpcrl.

The file maps raw observations to the greedy action the env takes, with the run's observation
normalisation folded in (:mod:`hpcrl.policy.export`); a JSON beside it names the env, the spaces,
the algorithm, the hpcrl version and the checkpoint's version. Load it with ``torch.jit.load``.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hpcrl.policy.export import FORMATS

    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (config.yaml, checkpoints/)")
    parser.add_argument("--checkpoint", metavar="PATH",
                        help="a checkpoint file (default: the run's newest intact one in RUN_DIR/checkpoints)")
    parser.add_argument("--format", choices=FORMATS, default="torchscript",
                        help="torchscript (torch.jit.load) or onnx (needs the onnx package); default torchscript")
    parser.add_argument("-o", "--output", metavar="OUT",
                        help="the file to write (a name with a suffix), or a folder (a name without one; "
                             "default RUN_DIR/export/policy.pt or policy.onnx); the JSON goes beside the file "
                             "(its name + .json)")


def main(args: argparse.Namespace) -> int:
    from hpcrl.policy.export import export_policy
    from hpcrl.policy.load import load_policy

    policy = load_policy(args.run_dir, args.checkpoint)
    path, meta = export_policy(policy, args.output, args.format)
    space = policy.env.observation_space
    folded = "observation normalisation folded in" if policy.sampler.obs_rms is not None else "no normalisation"
    print(f"hpcrl export: {path} ({args.format}: raw observations [batch, {', '.join(map(str, space.shape))}] -> "
          f"the greedy action the env takes; {folded}; checkpoint version {policy.version}), {meta.name} beside it")
    if args.format == "torchscript":
        print(f"  load: policy = torch.jit.load({str(path)!r}); action = policy(torch.as_tensor(obs[None], "
              f"dtype=torch.float32))[0]")
    return 0
