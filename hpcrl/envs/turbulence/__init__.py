"""Wall-modelled LES of turbulent channel flow and its multi-agent wall-model environment.

``solver.ChannelLES`` is the flow solver, ``wall_models`` the equilibrium log-law baseline,
``env.TurbulentChannelEnv`` the PettingZoo environment (Bae & Koumoutsakos 2022). Importing this
package imports nothing heavy; the environment spins up its turbulent fields on first reset.
"""
