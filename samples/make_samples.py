"""Regenerate the bundled sample arrays (deterministic). Run: python samples/make_samples.py"""

from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def main() -> None:
    rng = np.random.default_rng(2026)
    # A transformer-like projection weight: Gaussian rows with log-normal row scales.
    rows = np.exp(rng.normal(0, 0.5, (256, 1))).astype(np.float32)
    w = (rng.standard_normal((256, 512)) * 0.02 * rows).astype(np.float32)
    np.save(HERE / "weights.npy", w)


if __name__ == "__main__":
    main()
