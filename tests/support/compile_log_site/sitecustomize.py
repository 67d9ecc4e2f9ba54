"""With ``QSTREAM_COMPILE_LOG`` set, conftest puts this folder on the PYTHONPATH of the test
processes' children, so the qstream subprocesses of tests log their compilations too (see
``tests/support/compile_log.py``): the log starts once ``qstream.kernels.runtime`` is loaded."""

import importlib.abc
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


class _After(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "qstream.kernels.runtime":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            path = os.path.join(os.path.dirname(HERE), "compile_log.py")
            log_spec = importlib.util.spec_from_file_location("_qstream_compile_log", path)
            log = importlib.util.module_from_spec(log_spec)
            log_spec.loader.exec_module(log)
            log.install(label="subprocess " + " ".join(sys.argv)[:200])

        spec.loader.exec_module = exec_module
        return spec


def _log_lifetime(folder: str) -> None:
    """One line per child process at its exit (``procs-<pid>.jsonl``): its command, start,
    end and the test that started it, to count what the suite's subprocesses cost."""
    import atexit
    import json
    import time

    line = {"argv": " ".join(sys.argv)[:200], "start": time.time(),
            "test": os.environ.get("QSTREAM_LOG_TEST", "")}  # fmt: skip

    def write() -> None:
        line["end"] = time.time()
        with open(os.path.join(folder, f"procs-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(line) + "\n")

    atexit.register(write)


if os.environ.get("QSTREAM_COMPILE_LOG"):
    sys.meta_path.insert(0, _After())
    _log_lifetime(os.environ["QSTREAM_COMPILE_LOG"])
