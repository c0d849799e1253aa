"""Losses and estimators as plain torch functions (no MPI): returns, PPO with Stellaris IS truncation."""
