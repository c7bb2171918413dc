"""A recipe is a validated model: unknown or misspelt keys refused at load, defaults in one place, --dry-run."""

from __future__ import annotations

import pytest

from engine.errors import WorkbenchError
from engine.recipes.spec import load_recipe, resolved_steps


def _recipe(tmp_path, text: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(f"work: {tmp_path / 'work'}\n" + text)
    return str(path)


def test_an_unknown_top_level_key_is_refused_with_the_known_ones(tmp_path):
    with pytest.raises(WorkbenchError, match="unknown key 'tragets'") as e:
        load_recipe(_recipe(tmp_path, "tragets: smollm2-135m-instruct\n"))
    assert "did you mean 'target'" in str(e.value) and "evaluate" in e.value.hint and "ship" in e.value.hint


@pytest.mark.parametrize("section,text,bad", [
    ("extract", "extract: {algo: eagle3, max_lenght: 256}\n", "max_lenght"),
    ("regenerate", "regenerate: {max_new_token: 8}\n", "max_new_token"),
    ("bench", "bench: {num_prompt: 2}\n", "num_prompt"),
    ("train", "train: {algo: eagle3, learning_rate: 0.1}\n", "learning_rate"),
])
def test_a_misspelt_step_key_is_refused_at_load(tmp_path, section, text, bad):
    with pytest.raises(WorkbenchError, match=f"unknown key '{bad}' in the recipe's {section}: section") as e:
        load_recipe(_recipe(tmp_path, text))
    assert "known keys:" in e.value.hint


def test_a_bad_value_and_a_bad_measurement_key_are_refused(tmp_path):
    with pytest.raises(WorkbenchError, match="extract: section is invalid.*dtype"):
        load_recipe(_recipe(tmp_path, "extract: {dtype: fp64}\n"))
    with pytest.raises(WorkbenchError, match="num_promts"):
        load_recipe(_recipe(tmp_path, "sweep: {num_promts: 3}\n"))


def test_defaults_are_filled_once_and_dry_run_shows_them(tmp_path, capsys):
    from engine.cli import main
    from engine.targets.resolve import DEFAULT_TARGET

    path = _recipe(tmp_path, "extract: {algo: dflash, max_samples: 3}\nevaluate:\nsweep: {ks: [1, 2]}\n")
    recipe = load_recipe(path)
    assert recipe["target"] == DEFAULT_TARGET and recipe["evaluate"]["num_prompts"] == 20  # `evaluate:` alone
    assert recipe["extract"] == {"algo": "dflash", "max_samples": 3}  # as written: the step's argv is unchanged
    steps = resolved_steps(recipe)
    assert steps["extract"]["batch_size"] == 16 and steps["extract"]["split"] == "all"
    assert steps["sweep"]["max_new_tokens"] == 128
    assert main(["recipe", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "resolved options" in out and "batch_tokens: 4096" in out and "algo: dflash" in out
    assert not (tmp_path / "work").exists()  # a dry run writes nothing
