#!/usr/bin/env bash
# A Python environment for CleanRL's ppo_continuous_action.py, run as it is published, beside hpcrl's
# (`hpcrl bench hopper-vs-cleanrl`). CleanRL pins gymnasium 0.29.1 (its script uses that version's
# wrappers and final_info); MuJoCo is taken at the version hpcrl's environment has, so both sides step
# the same physics. The CPU wheel of torch as in the Makefile.
#
#   bash scripts/cleanrl_env.sh DIR [HPCRL_PYTHON]   # DIR/bin/python is CleanRL's Python afterwards
#
# CleanRL's script itself is not part of hpcrl: put it next to DIR, e.g. (commit fe8d8a03 was measured)
#   curl -fsSLo DIR/ppo_continuous_action.py \
#     https://raw.githubusercontent.com/vwxyzjn/cleanrl/fe8d8a03c41a7ef5b523e2e354bd01c363e786bb/cleanrl/ppo_continuous_action.py
set -euo pipefail
dir=${1:?usage: bash scripts/cleanrl_env.sh DIR [HPCRL_PYTHON]}
hpcrl_python=${2:-.venv/bin/python}
mujoco_version=$("$hpcrl_python" -c "import mujoco; print(mujoco.__version__)")
python3 -m venv "$dir"
"$dir/bin/python" -m pip install -q --upgrade pip
"$dir/bin/python" -m pip install -q torch==2.13.0 "gymnasium==0.29.1" "numpy<2" "mujoco==$mujoco_version" tyro \
    tensorboard "imageio>=2.14.1,<3"
"$dir/bin/python" -c "import gymnasium as gym; gym.make('Hopper-v4').reset(seed=0); print('CleanRL environment ready:', '$dir/bin/python')"
