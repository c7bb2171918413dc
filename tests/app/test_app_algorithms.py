"""The Train page offers a plugin algorithm's own arguments (the toy of tests/toy_algo) once it is registered."""

from __future__ import annotations


def test_toy_arguments_appear_in_the_train_form(toy_registered, tiny_targets, tmp_path, monkeypatch):
    from test_app import ok, open_app

    monkeypatch.setenv("WORKBENCH_RUNS", str(tmp_path / "runs"))
    at = open_app(str(tiny_targets["llama"]), page="train")
    at.selectbox(key="train_f_algo").set_value("toy").run()
    ok(at)
    widget = at.number_input(key="train_f_toy__toy_init_std")
    assert widget.label == "Toy init std"  # the field's name in words; the name itself ends the help
    assert widget.help.startswith(toy_registered.args_class.model_fields["toy_init_std"].description)
    assert "`toy_init_std`" in widget.help
    assert not [w for w in at.number_input if w.key == "train_f_eagle3__ttt_steps"]  # only the chosen algorithm's
