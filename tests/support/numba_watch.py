"""``qstream ARGS`` in a fresh process, reporting whether it loaded Numba (or other modules):
for the tests that check which commands run no kernel (a plan, a finished output, a small
conversion) and what a small conversion loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import json, os, sys
from cli.main import main
sys.argv = ["qstream", *sys.argv[1:]]
try:
    main()
except SystemExit as e:
    code = e.code
watched = json.loads(os.environ["QSTREAM_TEST_WATCHED"])
print(json.dumps({"code": code, **{m: m in sys.modules for m in watched}}))
"""


def run_watched(
    *args: str,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    watch: tuple[str, ...] = ("numba",),
) -> tuple[dict, subprocess.CompletedProcess]:
    """``({"code": exit code, "numba": loaded}, the finished process)`` of ``qstream ARGS``
    (``watch``: the modules reported, each by its name)."""
    env = {**(os.environ if env is None else env), "QSTREAM_TEST_WATCHED": json.dumps(watch)}
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
    )
    return json.loads(p.stdout.strip().splitlines()[-1]), p
