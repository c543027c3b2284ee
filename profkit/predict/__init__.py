"""Predictions: the memory estimate on the meta device, recommend, and published figures set beside them.
Imports core, store and model."""
