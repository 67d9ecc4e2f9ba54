"""``qstream ARGS`` in a fresh process, reporting whether it loaded Numba: for the tests that
check which commands run no kernel (a plan, a finished output, a small conversion)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import json, sys
from cli.main import main
sys.argv = ["qstream", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "numba": "numba" in sys.modules}))
"""


def run_watched(
    *args: str, cwd: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None
) -> tuple[dict, subprocess.CompletedProcess]:
    """``({"code": exit code, "numba": loaded}, the finished process)`` of ``qstream ARGS``."""
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    return json.loads(p.stdout.strip().splitlines()[-1]), p
