"""The documentation cannot drift from the code: the settings reference is generated from the code's own declarations
and must match the committed page; every option a command's --help shows is in it; the site builds with MkDocs in
strict mode (a broken link or anchor fails); the README's links resolve and it stays short; no user-facing page
narrates how the project was made.

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_docs.py``."""

from __future__ import annotations

import re

from tests.test_docs import DOCS


def test_own_training_examples_are_whole_scripts():
    """The two examples a user copies (a hand-written loop, a Trainer) are complete scripts; recording them is
    end-to-end (tests/e2e/test_session.py runs them)."""
    page = (DOCS / "pages" / "own-training.md").read_text()
    examples = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(examples) == 2
    for i, code in enumerate(examples):
        compile(code, f"own-training example {i}", "exec")
        assert "import torch, profkit" in code
    assert 'profkit.Session("traces/my_loop"' in examples[0]
    assert 'profkit.TrainerCallback("traces/my_trainer")' in examples[1]
