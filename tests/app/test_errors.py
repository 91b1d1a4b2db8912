"""User mistakes give a clear message in the page, never a traceback."""

import pytest

from tests.app.conftest import ROOT, calibrate, errors, no_exception, open_page


def load(at, kind: str, where: str):
    at.radio(key="model_kind").set_value(kind)
    at.text_input(key="model_where").set_value(where)
    return at.button(key="model_load").click().run()


@pytest.mark.parametrize("where, message", [
    ("/no/such/model-folder", "No such model folder"),
    (str(ROOT / "README-missing.gguf"), "No such model folder"),
])
def test_wrong_model_path(app, where, message):
    load(open_page(app, "model"), "Local folder or .gguf file", where)
    no_exception(app)
    assert any(message in e for e in errors(app))
    assert "bundled" in app.session_state["ghosted.model"]["source"]  # the working model stays


def test_unknown_hub_id_offline(app):
    load(open_page(app, "model"), "Hugging Face hub id", "nobody-here/no-such-model")
    no_exception(app)
    assert any("no-such-model" in e and "hub" in e.lower() for e in errors(app))


def test_dropping_every_layer(app):
    app.session_state["ghosted.selection"] = list(range(30))
    open_page(app, "influence")
    assert any("keep at least one" in e for e in errors(app))
    calibrate(app, list(range(30)), ["ghost"])
    no_exception(app)
    assert any("drops all 30 layers" in e for e in errors(app))
    assert "ghosted.run" not in app.session_state


def test_no_layers_selected(app):
    calibrate(app, [], ["ghost"])
    no_exception(app)
    assert any("at least one layer" in e for e in errors(app))


def test_empty_upload(app):
    app.session_state["ghosted.selection"] = [20, 21]
    open_page(app, "recover")
    app.radio(key="calib_kind").set_value("upload").run()
    app.get("file_uploader")[0].set_value(("empty.txt", b"", "text/plain"))
    app.button(key="calibrate_run").click().run()
    no_exception(app)
    assert any("empty" in e for e in errors(app))


def test_replaceme_cannot_start_at_layer_zero(app):
    calibrate(app, [0, 1], ["replaceme-ls"])
    no_exception(app)
    assert any("layer 0" in e for e in errors(app))
