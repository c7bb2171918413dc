"""The Train page offers a plugin algorithm's own arguments (the toy of tests/toy_algo) once it is registered."""

from __future__ import annotations


def test_toy_arguments_appear_in_the_train_form(toy_registered, tiny_targets, tmp_path, monkeypatch):
    from testkit.app import ok, open_app

    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path / "runs"))
    at = open_app(str(tiny_targets["llama"]), page="train")
    at.selectbox(key="train_f_algo").set_value("toy").run()
    ok(at)
    widget = at.number_input(key="train_f_toy__toy_init_std")
    assert widget.label == "Toy init std"  # the field's name in words; the name itself ends the help
    assert widget.help.startswith(toy_registered.args_class.model_fields["toy_init_std"].description)
    assert "`toy_init_std`" in widget.help
    assert not [w for w in at.number_input if w.key == "train_f_eagle3__ttt_steps"]  # only the chosen algorithm's


def test_train_form_offers_every_registered_algorithm_with_its_arguments(tiny_targets, tmp_path, monkeypatch):
    """The algorithm selector lists the registry (P-EAGLE included); choosing one shows its own arguments."""
    from engine.algos import ALGOS
    from testkit.app import ok, open_app
    from ui.training import algorithm_title

    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path / "runs"))
    at = open_app(str(tiny_targets["llama"]), page="train")
    assert "P-EAGLE (peagle)" in at.selectbox(key="train_f_algo").options
    assert at.selectbox(key="train_f_algo").options == [algorithm_title(n) for n in ALGOS.names()]
    at.selectbox(key="train_f_algo").set_value("peagle").run()
    ok(at)
    widget = at.number_input(key="train_f_peagle__num_depths")
    assert widget.help.startswith(ALGOS.get("peagle").args_class.model_fields["num_depths"].description)
