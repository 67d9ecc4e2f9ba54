"""The tests' real consumers in fresh processes (transformers and compressed-tensors loading an
export, llama.cpp's converter), where qstream is never imported, without paying their imports
at every call.

Each test process starts one *preloaded* server (this file run as a script) the first time it
needs one: the server imports torch and transformers (~1.8 s of every ~3.5 s helper run) and
then forks once per call, so each helper still runs in a new process of its own: its own argv,
environment, working folder, stdout and stderr; nothing carries from one call to the next but
those imports, and qstream is never imported there (checked). Only modules that start no
thread are preloaded (compressed-tensors and transformers' model classes start one, through
torch's compiler modules): a forked child has only the thread that forked it.

    run([script, *args], env=..., timeout=...) -> subprocess.CompletedProcess
    run(["-c", code, *args])                   # as ``python -c``
    run_json(script, *args) -> the JSON of the helper's last line of stdout (exit 0 asserted)
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SUPPORT = Path(__file__).parent
# what every helper imports first; each keeps the server single-threaded but for NumPy's BLAS
# pool, which is fork-aware (it stops before a fork and restarts in the child)
# (those not installed are left out: a Python without torch runs its helpers all the same)
PRELOAD = (
    "numpy", "torch", "safetensors", "tokenizers", "transformers",
    "transformers:AutoModelForCausalLM,AutoTokenizer,GenerationConfig,PreTrainedTokenizerFast",
)  # fmt: skip
# never in the server: the code under test, and what a helper must import from its own path
# (llama.cpp's converter brings its own gguf-py)
NEVER = ("qstream", "cli", "numba", "gguf")

_lock = threading.Lock()
_server: subprocess.Popen | None = None


def run(argv: list, env: dict[str, str] | None = None, timeout: float = 600,
        cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """``python *argv`` in a fresh process forked from the preloaded server; ``env`` the whole
    environment (default: this process's), as ``subprocess.run`` takes it."""
    argv = [str(a) for a in argv]
    with _lock, tempfile.TemporaryDirectory(prefix="qstream-fresh-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        request = {"argv": argv, "env": dict(os.environ if env is None else env),
                   "cwd": str(cwd or os.getcwd()), "stdout": out, "stderr": err}  # fmt: skip
        server = _started()
        server.stdin.write(json.dumps(request).encode() + b"\n")
        server.stdin.flush()
        pid = _reply(server, 60)["pid"]
        try:
            rc = _reply(server, timeout)["rc"]
        except subprocess.TimeoutExpired:
            os.kill(pid, 9)
            _reply(server, 60)
            raise subprocess.TimeoutExpired([sys.executable, *argv], timeout) from None
        with open(out, encoding="utf-8", errors="replace") as f:
            stdout = f.read()
        with open(err, encoding="utf-8", errors="replace") as f:
            stderr = f.read()
    return subprocess.CompletedProcess([sys.executable, *argv], rc, stdout, stderr)


def run_json(script: str | os.PathLike, *args: object, timeout: float = 900) -> Any:
    """Run a helper of ``tests/support`` (or any script) with warnings off; assert it exits 0
    and return the JSON of its last line of stdout."""
    path = script if os.path.isabs(script) else SUPPORT / script
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    r = run([path, *args], env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _started() -> subprocess.Popen:
    global _server
    if _server is None or _server.poll() is not None:
        env = {k: v for k, v in os.environ.items() if k != "QSTREAM_COMPILE_LOG"}
        env["PYTHONWARNINGS"] = "ignore"
        _server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, env=env, bufsize=0)  # fmt: skip
        atexit.register(_server.stdin.close)  # (the server ends at the end of its input)
        ready = _reply(_server, 120)
        assert ready.get("ready"), ready
    return _server


def _reply(server: subprocess.Popen, timeout: float) -> dict:
    """The server's next JSON line, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([server.stdout], [], [], left)[0]:
            raise subprocess.TimeoutExpired("preloaded server", timeout)
        byte = server.stdout.read(1)
        if not byte:
            raise RuntimeError(f"the preloaded server ended (exit {server.wait()})")
        line += byte
    return json.loads(line)


# --- the server (this file run as a script) ---------------------------------------------------


def _serve() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # (whatever the preloaded modules print stays off the replies)
    for item in PRELOAD:
        module, _, names = item.partition(":")
        try:
            loaded_module = importlib.import_module(module)
            for name in filter(None, names.split(",")):
                getattr(loaded_module, name)  # (transformers resolves its names lazily)
        except ImportError:
            pass
    loaded = sorted(m for m in NEVER if m in sys.modules)
    threads = len(os.listdir("/proc/self/task"))
    print(json.dumps({"ready": not loaded, "loaded": loaded, "threads": threads}),
          file=replies, flush=True)  # fmt: skip
    # sys.path without the server's own first entry and PYTHONPATH (a child sets its own)
    own = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p not in own]
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            replies.close()
            _child(request, base_path)
        print(json.dumps({"pid": pid}), file=replies, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), file=replies, flush=True)


def _child(request: dict, base_path: list[str]) -> None:
    """Become ``python *argv`` (never returns)."""
    import runpy
    import traceback
    import warnings

    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        warnings.resetwarnings()
        if os.environ.get("PYTHONWARNINGS"):
            for spec in os.environ["PYTHONWARNINGS"].split(","):
                warnings.simplefilter(spec.strip())  # type: ignore[call-overload]
        # sys.path as ``python`` would build it: the script's folder, PYTHONPATH, the rest
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        argv = request["argv"]
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[:] = ["", *extra, *base_path]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *extra, *base_path]
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # (as the interpreter's exit does)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    _serve()
