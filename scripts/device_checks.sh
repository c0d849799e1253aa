#!/usr/bin/env bash
# The checks only a GPU node can run, in one call of a lent device machine (an H100/H200 with 16 cores), each
# bounded in time and logged to $OUT (default: ./device-out):
#   1. the CUDA tests (the device paths of the models, returns, batched classic control, HA2C/HDDPG, the
#      gradient and whole-step CUDA graphs, a CUDA learner in a real MPI job);
#   2. hpcrl bench learner-step (a minibatch gradient and a whole minibatch step: CPU, CUDA, CUDA graph);
#   3. update push on Hopper at CleanRL's settings (hopper.yaml) with 12 actors and a CUDA learner: gradient push,
#      update push eager, update push with each whole minibatch step one CUDA graph;
#   4. batched classic control at 100K and 1M instances on the GPU (seed 003's figures at 100K);
#   5. the sim-vs-real check on the node's 16 cores (a one-node profile of its cores, 12 actors, CPU learners:
#      the default job and two learner groups).
# The machine is bare: with a .whl/ folder in this repo's root (carried) on a GPU node, the script first makes a venv
# over the image's PyTorch and installs the wheels and hpcrl into it. QUICK=1 shrinks every check (a smoke
# test on a CPU machine; the CUDA parts then skip or say so). CHECKS="cuda-tests update-push ..." runs only
# those checks (names as the logs').
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/all.log") 2>&1  # the whole console too (the tool keeps only its tail)
QUICK=${QUICK:-0}
CHECKS=${CHECKS:-cuda-tests learner-step update-push classic-control sim-vs-real}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
SCRATCH=${TMPDIR:-/tmp}
VENV=$SCRATCH/hpcrl-device-venv  # made from .whl/ on a bare GPU node

if [ -d .whl ] && command -v nvidia-smi >/dev/null && [ ! -x "$VENV/bin/python" ]; then
  torch_site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  python3 -m venv --system-site-packages --without-pip "$VENV"
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$torch_site" > "$site/image_torch.pth"  # the image's python is itself a venv: name its packages
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
  "$VENV/bin/python" -m pip install -q --no-index --no-deps --no-build-isolation -e . \
    || { echo "hpcrl's editable install failed; using PYTHONPATH and a launcher"; export PYTHONPATH=$PWD:$PWD/analysis
         printf '#!/bin/sh\nexec python -m hpcrl "$@"\n' > "$VENV/bin/hpcrl"; chmod +x "$VENV/bin/hpcrl"; }
fi
[ -x "$VENV/bin/python" ] && export PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV"
[ -x .venv/bin/python ] && [ ! -x "$VENV/bin/python" ] && export PATH=$PWD/.venv/bin:$PATH

step() {  # step LOG SECONDS COMMAND...: run one check, bounded; its output is added to $OUT/LOG.log
  local name=$1 limit=$2
  shift 2
  [[ " $CHECKS " == *" $name "* ]] || return 0
  echo "=== $name ($(date -u +%H:%M:%S), at most ${limit} s): $*" | tee -a "$OUT/$name.log"
  local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$SCRATCH/step.out" 2>&1
  local rc=$?
  tail -n 25 "$SCRATCH/step.out"
  cat "$SCRATCH/step.out" >> "$OUT/$name.log"
  echo "=== $name: rc $rc in $((SECONDS - t0)) s" | tee -a "$OUT/$name.log"
}

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  python -c 'import torch, mpi4py, gymnasium; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
"mpi4py", mpi4py.__version__, "gymnasium", gymnasium.__version__)'
  getconf _NPROCESSORS_ONLN; lscpu | grep -m1 "Model name"
} 2>&1 | tee "$OUT/machine.log"

if [ "$QUICK" = 1 ]; then sizes=64; secs=0.2; steps=8192; counts=1000; svr_steps=6000; svr_rep=1
else sizes=64,256,1024; secs=0.5; steps=40960; counts=100000,1000000; svr_steps=30000; svr_rep=2; fi

step cuda-tests 110 python -m pytest -q -p no:cacheprovider -n 4 tests/test_cuda_graph.py \
  tests/test_cuda_graph_step.py tests/test_models.py tests/test_returns.py tests/test_classic_envs.py \
  tests/test_ha2c_hddpg.py "tests/test_cli_run.py" -k "not slow or cuda"

step learner-step 70 hpcrl bench learner-step --sizes "$sizes" --seconds "$secs"

# the same job (12 actors, the learner on the GPU where there is one), three ways: gradient push (each minibatch
# gradient a CUDA graph), update push eager, update push with each whole minibatch step a CUDA graph
# 12 actors on a 16-core node (4 cores left: rank 0, the learner, the system)
actors=$(( $(getconf _NPROCESSORS_ONLN) >= 16 ? 12 : 2 ))
# CleanRL's batch (2,048 steps) and update, cut into 128-step fragments so that 12 actors sample one batch together
# (at the shipped 2,048-step fragment every batch is one actor's: 12 actors sample no faster than one)
push=(hpcrl bench update-push --config hpcrl/configs/hopper.yaml --steps "$steps" -o "actors.count=$actors"
      -o actors.fragment_length=128 -o learners.device=auto)
step update-push 90 "${push[@]}" --modes gradient -o learners.cuda_graphs=true
step update-push 90 "${push[@]}" --modes update -o learners.cuda_graphs=false
step update-push 90 "${push[@]}" --modes update -o learners.cuda_graphs=true

step classic-control 80 hpcrl bench classic-control --counts "$counts" --envs cartpole,acrobot,pendulum \
  --sync-max 1000 --repeats 2 --seconds 1

cores=$(getconf _NPROCESSORS_ONLN)
cat > "$SCRATCH/node-profile.yaml" <<EOF
name: device-node
description: The lent device machine's $cores cores, one node, a core per rank; this machine's costs, measured per case.
costs_from: this-machine
nodes:
  - {name: node, count: 1, cores: $cores, gpus: 0, cpu_speed: 1.0, price_per_hour: 0.0}
network: {latency_seconds: 0.0, bytes_per_second: 4.0e9}
oversubscribe: false
start_seconds: 4.25
EOF
step sim-vs-real 200 hpcrl bench sim-vs-real --steps "$svr_steps" --repeats "$svr_rep" --cases default,two-groups \
  --measure-seconds 1.5 \
  --profile "$SCRATCH/node-profile.yaml" --json "$OUT/sim-vs-real-node.json" -o "actors.count=$actors" \
  -o learners.device=cpu
echo "=== done $(date -u +%H:%M:%S)"
