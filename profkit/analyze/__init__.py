"""Analysis of recorded runs: pure functions from stored files to long-format pandas DataFrames.

``breakdown(paths)`` (``analyze.facade``) is the way in: discovery (``analyze.discovery``) finds the runs and
traces, each source is analysed into parts (``analyze.sources``, its memory in ``analyze.run_memory``), in worker
processes where there are many (``analyze.workers``), and the parts are merged into one ``Breakdown``.
No torch import.
"""

from profkit.analyze.categories import TIME_CATEGORIES
from profkit.analyze.discovery import Problem, Source, discover
from profkit.analyze.facade import Breakdown, breakdown
from profkit.analyze.memory import MEMORY_CATEGORIES, analyze_lifetimes
from profkit.analyze.predicted import predicted_vs_measured

__all__ = ["Breakdown", "MEMORY_CATEGORIES", "Problem", "Source", "TIME_CATEGORIES", "analyze_lifetimes",
           "breakdown", "discover", "predicted_vs_measured"]
