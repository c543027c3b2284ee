"""Vocabulary every layer shares, and nothing else: the method registry, presets, run settings, phase labels,
memory categories, units, exit codes, bundled data paths and the quieting of library chatter. No torch."""
