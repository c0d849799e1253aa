"""PAR-RL's solver-driven workloads: Lorenz control, 2D LES closure, OpenFOAM dynamic relaxation.

Each module is imported on its own (through the env registry), so naming the Lorenz env never
imports the spectral solver or looks for OpenFOAM. See docs/parrl.md.
"""
