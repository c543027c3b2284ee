"""Recording: the profiler lifecycle (Session), its phase labels, the inventory of live objects, what a
setup is read from its objects, the Trainer callback. Imports core, store and model; never predict, report or
cli (a predictor is passed in)."""
