"""``convert``'s refusals name what the user wrote: a spec flag as the flag (not as a recipe's
``[defaults]`` when no recipe was given), a NaN policy as the recipe key it is (``convert``
has no ``--nan-policy``), a recipe rule by what is wrong with it, a recipe that is a folder as
a bad input (exit 2)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from typer.testing import CliRunner

from cli.main import app

SAMPLE = Path(__file__).resolve().parents[2] / "samples" / "tiny-transformer.safetensors"
runner = CliRunner()


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--dtype", "int9"], "error: unknown --dtype 'int9' (did you mean 'int8'?)"),
        (["--block-size", "0"], "error: --block-size must be > 0, got 0"),
        (["--method", "foo"], "error: unknown --method 'foo'"),
        (["--method", "entrpy"], "error: unknown --method 'entrpy' (did you mean 'entropy'?)"),
        (
            ["--scale-dtype", "bf16"],
            "error: unknown --scale-dtype 'bf16' (did you mean 'bfloat16'?)",
        ),
    ],
)
def test_a_bad_spec_flag_is_named_as_the_flag(tmp_path, flags, said):
    r = runner.invoke(app, ["convert", str(SAMPLE), str(tmp_path / "o.zarr"), *flags])
    assert r.exit_code == 2
    assert r.stderr.startswith(said) and "recipe" not in r.stderr
    assert not (tmp_path / "o.zarr").exists()


def test_non_finite_values_point_to_the_recipe_key_not_a_missing_flag(tmp_path):
    x = np.random.default_rng(54).standard_normal((16, 32)).astype(np.float32)
    x[3, 4] = np.nan
    save_file({"layers.0.mlp.weight": x}, str(tmp_path / "nan.safetensors"))
    r = runner.invoke(app, ["convert", str(tmp_path / "nan.safetensors"), str(tmp_path / "o")])
    assert r.exit_code == 1
    assert 'Set nan_policy = "zero_point" (or "min") in a --recipe spec' in r.stderr
    assert "--nan-policy" not in r.stderr


def test_a_keep_rule_with_a_spec_is_refused_for_its_spec(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[rules]]\npattern = "*q_proj*"\naction = "keep"\nspec = {dtype = "int4"}\n')
    r = runner.invoke(app, ["convert", str(SAMPLE), str(tmp_path / "o"), "--recipe", str(recipe)])
    assert r.exit_code == 2
    assert 'a "keep" rule has no spec' in r.stderr and "got 'keep'" not in r.stderr


def test_a_recipe_that_is_a_folder_is_a_bad_input(tmp_path):
    (tmp_path / "rdir").mkdir()
    r = runner.invoke(
        app, ["convert", str(SAMPLE), str(tmp_path / "o"), "--recipe", str(tmp_path / "rdir")]
    )
    assert r.exit_code == 2 and "not a regular file" in r.stderr


def test_a_memory_destination_for_a_checkpoint_is_refused_in_the_plan():
    # (its tensors' groups were written where no reader of memory://NAME looks)
    import qstream as qs

    with pytest.raises(qs.InvalidParameterError, match="not a memory:// store"):
        qs.plan_convert(SAMPLE, "memory://ck-plan")
    r = runner.invoke(app, ["convert", str(SAMPLE), "memory://ck-cli"])
    assert r.exit_code == 2 and "not a memory:// store" in r.stderr
