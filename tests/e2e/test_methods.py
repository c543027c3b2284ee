"""

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_methods.py``."""

import subprocess
import sys


def test_registry_imports_no_torch():
    code = "import sys, profkit.core.methods, profkit.core.presets, profkit.store; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_analysis_imports_no_torch():
    code = ("import sys, profkit.analyze, profkit.report.tables; "
            "assert 'torch' not in sys.modules, 'analysis must run without torch'")
    subprocess.run([sys.executable, "-c", code], check=True)
