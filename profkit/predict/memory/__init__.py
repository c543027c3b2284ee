"""The memory estimate's parts: one module per owner or mechanism, each returning what it adds to a step
(``contribution.Contribution``); ``training`` and ``generation`` combine them, ``predict.estimate`` is the entry."""
