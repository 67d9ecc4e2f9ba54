"""Helpers shared by the benchmark scripts."""

import os
import subprocess


def git_state() -> dict:
    """The commit benchmarked, and whether qstream/ had uncommitted changes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "qstream"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return {"commit": head, "qstream_dirty": bool(dirty)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "qstream_dirty": None}
