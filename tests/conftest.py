import os
import sys
import tempfile

# Kernels compile into a test-only cache (kept between runs on one machine), never the user's.
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "qstream-test-numba"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The TensorFlow profile reproduces TF's own CPU kernels (quantize_op.cc). On CPUs with
# AVX512_VNNI/AMX, TF rewrites some QuantizeV2/Dequantize calls to oneDNN kernels that round
# differently (see qstream.compat.tensorflow); compare against the reference kernels.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

# The bytecode of qstream's and the CLI's own modules, written once before the test workers
# start (as `qstream warm-up` writes qstream's): under PYTHONDONTWRITEBYTECODE a fresh clone
# has none, and each of the suite's ~300 qstream subprocesses would compile them again (~0.13 s
# each); compileall takes ~0.3 s. (Python still writes no other bytecode.)
if sys.dont_write_bytecode and not os.environ.get("PYTEST_XDIST_WORKER"):
    import compileall

    for _package in ("qstream", "cli"):
        compileall.compile_dir(os.path.join(os.path.dirname(__file__), "..", _package), quiet=2)

from hypothesis import HealthCheck, settings

settings.register_profile(
    "qstream", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", parent=settings.get_profile("qstream"), max_examples=40)
settings.load_profile("ci" if os.environ.get("CI") else "qstream")


# Moved out of the default run into `pytest -m slow` (issue 28: the default run within ~4 min on
# 2 cores). Each is a variant whose kind stays in the default run: the default keeps one build
# or backend of each, the kill tests keep their spot points (tests/support/kill_hook.py).
MOVED_TO_SLOW = (
    # first-run compiles in a fresh Numba cache, in subprocesses (the CLI's compile notice stays)
    "test_fused_builds.py::test_background_warm_up_of_a_dynamic_spec_runs_on_a_first_run_only",
    "test_kernel_runtime.py::test_background_warm_up_compiles_the_quantize_pass_for_the_job_on_",
    # the other builds of the finite/complete blocked kernel (int4 columns parallel and uint4
    # rows serial stay)
    "test_the_finite_build_gives_the_complete_builds_bytes_and_leaves_nan_to_it[int4-True-rows",
    "test_the_finite_build_gives_the_complete_builds_bytes_and_leaves_nan_to_it[int4-True-columns-s",
    "test_the_finite_build_gives_the_complete_builds_bytes_and_leaves_nan_to_it[uint4-False-col",
    "test_the_finite_build_gives_the_complete_builds_bytes_and_leaves_nan_to_it[uint4-False-rows-p",
    # a killed Dask client (the Dask bytes-equal tests and the local kill tests stay)
    "test_dask.py::test_killed_client_then_rerun_gives_the_uninterrupted_bytes_and_report",
    # kill spots of two more specs (per-axis and blocked-dynamic stay; every sweep is slow)
    "[per-axis-raw-spot]",
    "[per-tensor-percentile-spot]",
    # transformers loads of two more recipes (int8 per channel and int4 g128 stay)
    "test_transformers_loads_the_export_bit_identical_to_qstream_dequantize[int4-g128-full-",
    "test_transformers_loads_the_export_bit_identical_to_qstream_dequantize[uint8-asym-",
    # the obstore twins of two URL-checkpoint tests (the fsspec ones stay)
    "test_sharded_checkpoint_in_s3_converts_as_from_local_files[obstore]",
    "test_peak_memory_of_a_url_conversion_is_bounded_as_for_local_files[obstore]",
    # (issue 50: the default run within ~10 min from an empty Numba cache on 2 cores)
    # the serial twins of the asymmetric uint4 blocked build (int4 blocked stays)
    "test_serial_twins_write_the_same_bytes_and_report_as_parallel_kernels[dtype=uint4-",
    # FP8 logits against compressed-tensors' own export: one dtype per granularity stays
    "test_fp8_export_logits_equal_compressed_tensors_own_export[float32-FP8_DYNAMIC]",
    "test_fp8_export_logits_equal_compressed_tensors_own_export[bfloat16-FP8_BLOCK]",
    # every scheme stays from float32; from bfloat16, int4 and MXFP4 (bf16 scales) stay
    "test_scheme_export_equals_compressed_tensors_and_loads_bit_exact[bfloat16-W8A16]",
    "test_scheme_export_equals_compressed_tensors_and_loads_bit_exact[bfloat16-FP8_DYNAMIC]",
    "test_scheme_export_equals_compressed_tensors_and_loads_bit_exact[bfloat16-FP8_BLOCK]",
    "test_scheme_export_equals_compressed_tensors_and_loads_bit_exact[bfloat16-NVFP4A16]",
    # GGUF names back to Hugging Face's: llama and Qwen2-MoE stay (Mixtral's experts split)
    "test_hf_names_give_back_the_f32_model_exactly[mixtral]",
    # (session of 2026-11-29, third) the parallel build of the complete blocked kernel (its
    # serial build stays: the same source), a first compile of ~55 s from an empty cache
    "test_the_finite_build_gives_the_complete_builds_bytes_and_leaves_nan_to_it[int4-True-col",
    # the obstore twins of quantized checkpoints in S3 (every fsspec case and one obstore
    # read stay; obstore's ranged reads of checkpoints stay in test_url_checkpoints)
    "test_a_compressed_tensors_checkpoint_in_s3_reads_as_from_local_files[W4_GROUP_SYM-obstore]",
    "test_a_compressed_tensors_checkpoint_in_s3_reads_as_from_local_files[W4A16_ASYM-obstore]",
    "test_nvfp4_mxfp8_fp8_block_and_int8_checkpoints_in_s3_read_as_from_local_files[MXFP8-obs",
    "test_nvfp4_mxfp8_fp8_block_and_int8_checkpoints_in_s3_read_as_from_local_files[FP8_BLOCK-o",
    "_converts_to_the_bytes_of_a_local_conversion[W4_GROUP_SYM-obstore]",
    "_converts_to_the_bytes_of_a_local_conversion[W4A16_ASYM-obstore]",
    "test_gpt_oss_mxfp4_experts_in_s3_read_and_convert_as_from_local_files[obstore]",
    "test_dask_workers_read_their_own_ranges[obstore]",
    # export kills: 3 shards to 2 (one file to shards and shards to one file stay)
    "test_an_overwriting_export_killed_anywhere_leaves_no_index_naming_missing_shards[3-shards",
    # a K-quant GGUF killed mid-write without an imatrix (with one stays)
    "test_a_kquant_gguf_killed_mid_write_leaves_no_complete_looking_file_and_reruns_exactly[pl",
    # the fused group-wise kernel's int16 and uint8 first compiles (int8, int4, uint4, int2,
    # uint2 and every block size stay)
    "test_fused_groupwise_kernel_is_bit_identical_to_the_unfused_path[int16-",
    "test_fused_groupwise_kernel_is_bit_identical_to_the_unfused_path[uint8-",
    # FP8 logits: FP8_BLOCK from float32 stays (FP8_DYNAMIC's bytes equal compressed-tensors')
    "test_fp8_export_logits_equal_compressed_tensors_own_export[bfloat16-FP8_DYNAMIC]",
    # (session of 2026-11-29, fourth) quantize_dynamic against quantize_store with int16
    # codes: the blocked kernel's int16 builds (~20 s of first compiles; every other code
    # type stays, and int16 per channel and per tensor stay everywhere else)
    "test_quantize_dynamic_gives_the_codes_and_parameters_of_quantize_store[float32-int16-",
    "test_quantize_dynamic_gives_the_codes_and_parameters_of_quantize_store[float64-int16-",
    # compressed-tensors checkpoints in S3: the symmetric int4 groups' twin of the asymmetric
    # ones (the same packed layout without zero points; FP8 and W4A16_ASYM stay)
    "test_a_compressed_tensors_checkpoint_in_s3_reads_as_from_local_files[W4_GROUP_SYM-fsspec]",
    "_converts_to_the_bytes_of_a_local_conversion[W4_GROUP_SYM-fsspec]",
    "test_the_command_line_converts_a_compressed_tensors_url_as_local_files[W4_GROUP_SYM]",
    # misbehaving endpoints through obstore: stalled reads and writes stay (and every fault
    # through fsspec); the dripping ones move, as does the second environment variant
    "test_a_dripping_or_silent_endpoint_ends_the_run_within_its_deadline[obstore-drip-reads]",
    "test_a_dripping_or_silent_endpoint_ends_the_run_within_its_deadline[obstore-dripped-wr",
    "test_cli_quantizes_and_converts_s3_urls_configured_by_the_environment[obstore-http-sch",
    # recipe exports in the model's dtype: float16 models (bfloat16 stays; float16 scales'
    # rounding stays in tests/core/test_scale_rounding.py), and bf16 W4A16 (bf16 MXFP4 stays)
    "_by_recipe_loads_in_its_own_dtype_bit_exact[float16]",
    "test_bf16_scales_are_the_float32_scale_rounded_to_nearest_even_as_torch_does[float16]",
    "test_scale_dtype_float32_keeps_float32_scales_and_the_api_defaults_as_the_cli[float16]",
    "test_scheme_export_equals_compressed_tensors_and_loads_bit_exact[bfloat16-W4A16]",
    # a packed conversion killed at spot writes: test_packs' kills of the same conversion
    # kind stay (same files, metadata and report), as do the sample's spot kills here
    "test_a_conversion_killed_at_any_kind_of_write_then_rerun_has_the_uninterrupted_bytes[packs-s",
)


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker more than the cores this process may run on (``--maxprocesses``
    still caps it; ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still overrides it). A worker also waits,
    on subprocesses, the S3 server, deadlines and the disk: from an empty cache on 2 cores, in a
    slow hour two workers kept the cores 80% busy and three 97-98% (wall 19:08 -> 15:17 for the
    same CPU time); in a fast hour both took the same time (8:22 and 8:24-8:25 on fresh clones:
    the third worker's own collection and first compiles cost what its filling idle time won)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # (xdist's own hook reads it)
    if hasattr(os, "sched_getaffinity"):  # (Linux: the cores this process may use)
        return len(os.sched_getaffinity(0)) + 1
    return (os.cpu_count() or 1) + 1


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if any(part in item.nodeid for part in MOVED_TO_SLOW):
            item.add_marker(pytest.mark.slow)


import pytest  # noqa: E402

from .support import worker_imports  # noqa: E402

worker_imports.install()


@pytest.fixture(autouse=True)
def no_import_in_worker_threads():
    """No module is first loaded by a qstream worker thread during a test (issue 44: two
    threads importing at once can deadlock on Python's module locks)."""
    worker_imports.taken()
    yield
    got = worker_imports.taken()
    assert not got, f"modules first imported by qstream worker threads: {got}"


from .support import compile_log  # noqa: E402

compile_log.install()
if os.environ.get("QSTREAM_COMPILE_LOG"):  # (the tests' qstream subprocesses log theirs too)
    _site = os.path.join(os.path.dirname(__file__), "support", "compile_log_site")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_site, os.environ.get("PYTHONPATH")) if p
    )


@pytest.fixture(autouse=True)
def _name_the_compiling_test(request):
    compile_log.name_test(request.node.nodeid)
    with compile_log.timed(request.node.nodeid):
        yield
