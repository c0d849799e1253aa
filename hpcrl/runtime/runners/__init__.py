"""Runners: each builds the Plan's roles and runs them (``mpi``: one rank per role; ``serial``: every role in one
process; ``fused``: one device loop), plus fast start (prestart) and start-up timing."""
