"""Object stores configured by the environment alone, from the command line: the standard
``AWS_*`` variables (endpoint, keys, region, ``AWS_ALLOW_HTTP``) reach an ``http://`` endpoint
(the moto server on loopback) through both ``--store fsspec`` and ``--store obstore``; a store
failure names its own cause, not a timeout it is not."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import qstream as qs

from ..e2e.test_s3 import BUCKET, _put_source, _read, _s3, backend, endpoint  # noqa: F401 (fixtures)
from ..e2e.test_url_checkpoints import _same_conversion
from ..support import s3_fixtures
from .test_fp8_checkpoints import write_safetensors

pytest.importorskip("s3fs")

CLI_TIMEOUT = 300  # seconds a qstream subprocess may take before the test fails


def _environment(url: str, **extra: str) -> dict[str, str]:
    """The process environment with the moto server's configuration in the standard
    variables only (any AWS_* of the caller's own removed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.pop("QSTREAM_STORE_TIMEOUT", None)
    env.update(
        AWS_ENDPOINT_URL=url,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    env.update(extra)
    return env


def _qstream(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from cli.main import console; console()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=CLI_TIMEOUT,
    )


# Each store is run with each way of allowing http: AWS_ALLOW_HTTP=true, or nothing but the
# endpoint's http:// scheme; the region in AWS_REGION (obstore's name, passed on to botocore)
# or AWS_DEFAULT_REGION.
VARIANTS = {
    "allow-http": {"AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1"},
    "http-scheme": {"AWS_DEFAULT_REGION": "us-east-1"},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cli_quantizes_and_converts_s3_urls_configured_by_the_environment(
    endpoint,  # noqa: F811
    backend,  # noqa: F811
    variant,
    tmp_path,
):
    env = _environment(endpoint, **VARIANTS[variant])
    key = f"env-{backend}-{variant}"
    rng = np.random.default_rng(21)
    x = (rng.standard_normal((64, 96)) * 0.05).astype(np.float32)
    src = _put_source(endpoint, f"{key}/src.zarr", x, (16, 48))
    q = f"s3://{BUCKET}/{key}/q.zarr"
    r = _qstream(env, "quantize", src, q, "--axis", "0", "--store", backend, "-q")
    assert r.returncode == 0, r.stderr
    clean = qs.quantize_store(x, f"memory://env-{key}", qs.QuantSpec(axis=0), overwrite=True)
    np.testing.assert_array_equal(
        _read(endpoint, f"{key}/q.zarr/data"),
        qs.open_quantized(f"memory://env-{key}").quantized(...),
    )
    assert clean.error["sqnr_db"] > 20
    # an s3:// safetensors checkpoint, converted into S3 (its bytes as from the local file)
    tensors = {
        "layer.weight": (rng.standard_normal((128, 64)) * 0.02).astype(np.float32),
        "layer.norm": rng.standard_normal(64).astype(np.float32),
    }
    write_safetensors(tmp_path / "m.safetensors", tensors)
    _s3(endpoint).put_object(
        Bucket=BUCKET, Key=f"{key}/m.safetensors", Body=(tmp_path / "m.safetensors").read_bytes()
    )
    local = tmp_path / "local"
    qs.convert_checkpoint(tmp_path / "m.safetensors", local, qs.Recipe.from_dict({}))
    dst = f"s3://{BUCKET}/{key}/m-int8.zarr"
    r = _qstream(env, "convert", f"s3://{BUCKET}/{key}/m.safetensors", dst, "--store", backend)
    assert r.returncode == 0, r.stderr
    fs_opts = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }
    _same_conversion(local, dst, list(tensors), fs_opts)
    # and a re-run finds it complete, still by the environment alone
    r = _qstream(env, "convert", f"s3://{BUCKET}/{key}/m.safetensors", dst, "--store", backend)
    assert r.returncode == 0, r.stderr


def test_cli_refuses_plain_http_that_aws_allow_http_forbids_naming_why(
    endpoint,  # noqa: F811
    backend,  # noqa: F811
):
    env = _environment(endpoint, AWS_ALLOW_HTTP="false", AWS_REGION="us-east-1")
    src = _put_source(endpoint, f"forbid-{backend}/src.zarr", np.ones((8, 8), np.float32), (8, 8))
    r = _qstream(env, "quantize", src, f"s3://{BUCKET}/forbid-{backend}/q.zarr", "--store", backend)
    assert r.returncode == 2, (r.returncode, r.stderr)  # (refused by the plan)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert src in lines[0] and "AWS_ALLOW_HTTP=false" in lines[0] and endpoint in lines[0]
    assert "timeout" not in lines[0].lower()


def test_an_invalid_aws_allow_http_is_a_usage_error(endpoint, backend, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AWS_ALLOW_HTTP", "maybe")
    with pytest.raises(qs.InvalidParameterError, match="AWS_ALLOW_HTTP must be true or false"):
        qs.quantize_store(
            np.ones((8, 8), np.float32),
            f"s3://{BUCKET}/invalid-{backend}/q.zarr",
            storage_options={"endpoint_url": endpoint} if backend == "fsspec" else {},
            store=backend,
        )


def test_obstore_builder_error_is_named_with_its_cause_not_as_a_timeout(endpoint):  # noqa: F811
    """obstore's own client, told not to allow http, against the http endpoint: qstream's
    message is the library's cause (the builder error, its BadScheme and what allows http),
    not "no answer within its timeout"."""
    obstore = pytest.importorskip("obstore")
    from obstore.store import S3Store

    from qstream.io.storage.backends import store_failure

    store = S3Store(
        BUCKET,
        endpoint=endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
        client_options={"allow_http": False},
    )
    with pytest.raises(Exception) as e:
        obstore.get(store, "nothing/zarr.json")
    err = store_failure(e.value, f"s3://{BUCKET}/nothing")
    assert err is not None
    message = str(err)
    assert "\n" not in message and message.startswith(f"s3://{BUCKET}/nothing: ")
    assert "builder error" in message and "BadScheme" in message and "allow_http" in message
    assert "timeout" not in message.lower()
    # through qstream, an explicit allow_http=False is refused before any request, by name
    with pytest.raises(qs.StoreError, match=r"plain http, which allow_http=False forbids"):
        qs.quantize_store(
            np.ones((8, 8), np.float32),
            f"s3://{BUCKET}/builder/q.zarr",
            storage_options={
                "endpoint": endpoint,
                "access_key_id": "testing",
                "secret_access_key": "testing",
                "region": "us-east-1",
                "client_options": {"allow_http": False},
            },
            store="obstore",
        )


# ------------------------------------------------ a deadline per request (issue 51 item 3)

DEADLINE = 2  # QSTREAM_STORE_TIMEOUT of these runs, seconds
BOUND = 10 * DEADLINE + 15  # generous: a run ends; a drip that extended requests takes > 50 s


proxy = s3_fixtures.proxy  # (the fixture, shared)


@pytest.fixture
def px(proxy):
    proxy.reset()
    proxy.drip_bytes, proxy.drip_every = 4, 0.5  # ~8 B/s: a 400-byte answer takes 50 s
    yield proxy
    proxy.reset()


def _chunk_of(method: str, part: str, fault: str):
    """A policy: ``fault`` for the requests ``method`` to paths holding ``part``."""
    return lambda r: fault if r["method"] == method and part in r["path"] else None


FAULTS = {  # (what the proxy does, to which requests of the run)
    "drip-reads": ("GET", "/src.zarr/c/", "drip"),
    "stalled-reads": ("GET", "/src.zarr/c/", "stall"),
    "stalled-writes": ("PUT", "/q.zarr/data/c", "stall"),
    "dripped-write-answers": ("PUT", "/q.zarr/data/c", "drip-headers"),
}


def _timed(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    import time

    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", "from cli.main import console; console()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,  # (the bound of the test itself: a hang fails it here)
    )
    return r, time.monotonic() - t0


_NOISE = ("Task was destroyed", "Exception ignored", "Task exception was never retrieved")


def _error_line(stderr: str) -> str:
    """The run's one ``error:`` line. Around it, asyncio may print notes on zarr's reads
    left pending when another read of a batch failed (garbage collection, at any time): those
    are allowed, but no continuation of the error (its line is followed by nothing or by
    such a note)."""
    lines = stderr.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    assert len(errors) == 1, stderr
    after = lines[errors[0] + 1 : errors[0] + 2]
    assert not after or after[0].startswith(_NOISE), stderr
    return lines[errors[0]]


def _object(url: str, key: str) -> bytes | None:
    try:
        return _s3(url).get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except Exception:  # (no such key)
        return None


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_dripping_or_silent_endpoint_ends_the_run_within_its_deadline(
    endpoint,  # noqa: F811
    px,
    backend,  # noqa: F811
    fault,
):
    import json

    method, part, what = FAULTS[fault]
    key = f"deadline-{fault}-{backend}"
    rng = np.random.default_rng(5)
    x = rng.standard_normal((256, 64)).astype(np.float32)  # 8 chunks of 8 KiB
    src = _put_source(endpoint, f"{key}/src.zarr", x, (32, 64))
    q = f"s3://{BUCKET}/{key}/q.zarr"
    px.policy = _chunk_of(method, f"/{key}{part}", what)
    env = _environment(px.url, AWS_REGION="us-east-1", QSTREAM_STORE_TIMEOUT=str(DEADLINE))
    r, took = _timed(env, "quantize", src, q, "--axis", "0", "--store", backend, "-q")
    print(f"{backend} {fault}: ended in {took:.1f} s: {r.stderr.strip()}")
    assert any(e.get("fault") == what for e in px.log)  # the fault was met
    assert r.returncode == 1, (r.returncode, r.stderr)
    line = _error_line(r.stderr)
    assert (src if method == "GET" else q) in line
    assert "timeout" in line.lower()
    assert took < BOUND, took
    root = _object(endpoint, f"{key}/q.zarr/zarr.json")
    if root is not None:  # nothing complete-marked
        assert json.loads(root)["attributes"]["qstream"]["complete"] is False


def test_a_checkpoint_whose_reads_drip_ends_within_its_deadline(
    endpoint,  # noqa: F811
    px,
    backend,  # noqa: F811
    tmp_path,
):
    import json

    key = f"deadline-ck-{backend}"
    rng = np.random.default_rng(6)
    tensors = {f"l{i}.weight": rng.standard_normal((128, 64)).astype(np.float32) for i in range(3)}
    write_safetensors(tmp_path / "m.safetensors", tensors)
    _s3(endpoint).put_object(
        Bucket=BUCKET, Key=f"{key}/m.safetensors", Body=(tmp_path / "m.safetensors").read_bytes()
    )
    reads = {"n": 0}

    def policy(r):  # the header and the first tensor come; then every ranged read drips
        if r["method"] == "GET" and r["path"].endswith(f"/{key}/m.safetensors"):
            reads["n"] += 1
            return "drip" if reads["n"] > 2 else None
        return None

    px.policy = policy
    url, dst = f"s3://{BUCKET}/{key}/m.safetensors", f"s3://{BUCKET}/{key}/ck.zarr"
    env = _environment(px.url, AWS_REGION="us-east-1", QSTREAM_STORE_TIMEOUT=str(DEADLINE))
    r, took = _timed(env, "convert", url, dst, "--store", backend, "-q")
    print(f"{backend} checkpoint drip: ended in {took:.1f} s: {r.stderr.strip()}")
    assert any(e.get("fault") == "drip" for e in px.log)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert url in _error_line(r.stderr)
    assert took < BOUND, took
    root = _object(endpoint, f"{key}/ck.zarr/zarr.json")
    assert root is not None
    assert json.loads(root)["attributes"]["qstream_checkpoint"]["complete"] is False


_CALIBRATE = """
import json, sys
import qstream as qs
try:
    qs.calibrate(sys.argv[1], storage_options=json.loads(sys.argv[2]), store=sys.argv[3])
except qs.StoreError as e:
    print(e)
"""


def test_retries_stop_within_half_the_deadline_however_many_are_allowed(
    endpoint,  # noqa: F811
    px,
    backend,  # noqa: F811
):
    """Ten attempts allowed (botocore's, obstore's), every read stalled: the attempts after
    half the deadline are not made (without the budget: ten per chunk, with backoffs)."""
    key = f"deadline-budget-{backend}"
    src = _put_source(endpoint, f"{key}/src.zarr", np.ones((64, 16), np.float32), (32, 16))
    px.policy = _chunk_of("GET", f"/{key}/src.zarr/c/", "stall")
    if backend == "fsspec":
        opts = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": px.url, "region_name": "us-east-1"},
            "config_kwargs": {"retries": {"total_max_attempts": 10, "mode": "standard"}},
        }
    else:
        opts = {
            "endpoint": px.url,
            "access_key_id": "testing",
            "secret_access_key": "testing",
            "region": "us-east-1",
            "retry_config": {"max_retries": 10},
        }
    env = {**os.environ, "QSTREAM_STORE_TIMEOUT": str(DEADLINE)}
    import json

    r = subprocess.run(
        [sys.executable, "-c", _CALIBRATE, src, json.dumps(opts), backend],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert src in r.stdout and "deadline" in r.stdout, (r.stdout, r.stderr)
    per_chunk: dict[str, int] = {}
    for e in px.requests("GET"):
        if e.get("fault") == "stall":
            per_chunk[e["path"]] = per_chunk.get(e["path"], 0) + 1
    assert per_chunk and max(per_chunk.values()) <= 3, per_chunk
