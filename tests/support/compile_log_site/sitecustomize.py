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


if os.environ.get("QSTREAM_COMPILE_LOG"):
    sys.meta_path.insert(0, _After())
