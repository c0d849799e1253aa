"""Sweeps: a grid of configs x arms x seeds run as many runs, resumable (hpcrl sweep; docs/sweep.md)."""
