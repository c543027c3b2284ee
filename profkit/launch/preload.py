"""Imported once, in the server that forks single-process workers (``profkit.launch.forking``): what every
worker imports, so that none of them imports it again. Never imported by the command line's own process.

A library that fails to import here is left for the worker to import, where its failure is the run's recorded
reason; the server's own output (import-time notices) goes nowhere, each worker's to its run's log."""

from __future__ import annotations

import importlib

from profkit.core.quiet import library_output

# The worker's own modules (profkit.launch.worker's run), the libraries they import only on some paths, and the
# analysis, whose parallel workers (profkit.analyze.workers) are forked from the same server.
MODULES = ("profkit.launch.workload", "profkit.model.build", "profkit.record.describe", "profkit.record.environment",
           "profkit.record.session", "profkit.record.outcome", "profkit.predict.estimate", "profkit.predict.step_time",
           "profkit.analyze.sources",
           "peft", "bitsandbytes", "accelerate", "deepspeed")

with library_output(None):
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again and records why it failed
            pass
