"""What a run leaves: the RunRecord (run.h5 rows, round statistics, progress numbers, live TensorBoard scalars), row buffering,
the cycle profile, checkpoints, the progress display and the stop rule. No MPI here."""
