"""Launching recordings: the runner (one fresh process per run, ranks under torchrun, repetitions), the
worker each process runs, and the workload it steps. Composes model, predict and record."""
