#!/usr/bin/env bash
# Debian packages some tests use: the local Slurm cluster of scripts/local_cluster.sh (slurm-wlm,
# slurmdbd, munge, mariadb-server for its accounting, iproute2 for its namespaces), OpenFOAM v1912 for the
# PAR-RL workload, Chromium for the analysis report check, HDF5 1.10.8 readers (hdf5-tools:
# h5dump, h5ls; python3-h5py) for the record-format check. Installs what is missing when run as
# root with apt-get; otherwise says what is missing (those tests then skip with a reason).
set -u
packages=(slurm-wlm slurmdbd munge mariadb-server iproute2 openfoam openfoam-examples chromium hdf5-tools python3-h5py openmpi-bin)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && { echo "system packages: all present"; exit 0; }
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "system packages missing (tests that need them will skip): ${missing[*]}"
  echo "  install with: sudo apt-get install -y ${missing[*]}"
  exit 0
fi
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
  || { echo "apt-get install failed; tests that need ${missing[*]} will skip"; exit 0; }
