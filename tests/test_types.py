"""The package type-checks: ``python -m mypy`` (the settings in pyproject.toml: the public API
strictly) runs as a test, beside the others on the test workers rather than before them."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mypy_finds_no_errors_in_the_package():
    pytest.importorskip("mypy")
    r = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
