import os
import tempfile

# Kernels compile into a test-only cache (kept between runs on one machine), never the user's.
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "qstream-test-numba"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The TensorFlow profile reproduces TF's own CPU kernels (quantize_op.cc). On CPUs with
# AVX512_VNNI/AMX, TF rewrites some QuantizeV2/Dequantize calls to oneDNN kernels that round
# differently (see qstream.compat.tensorflow); compare against the reference kernels.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from hypothesis import HealthCheck, settings

settings.register_profile(
    "qstream", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", parent=settings.get_profile("qstream"), max_examples=40)
settings.load_profile("ci" if os.environ.get("CI") else "qstream")
