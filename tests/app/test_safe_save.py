"""The app never overwrites a folder by accident and reports a broken GGUF as a message, not a traceback."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ghosted.models.assets import cache_dir
from ghosted.models.loading import RECIPE_FILE
from tests.app.conftest import calibrate, errors, no_exception, open_page


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def converted_models() -> list[str]:
    """The converted models in Ghosted's cache (lock files aside)."""
    return sorted(p.name for p in (cache_dir() / "models").iterdir() if not p.name.endswith(".lock"))


def test_a_truncated_gguf_is_shown_as_an_error(app, tmp_path):
    from ghosted.models.assets import bundled_gguf_path

    path = tmp_path / "cut.gguf"
    with open(bundled_gguf_path(), "rb") as handle:
        path.write_bytes(handle.read(200))  # a download cut short: was struct.error in st.exception
    before = converted_models()
    at = open_page(app, "model")
    at.radio(key="model_kind").set_value("Local folder or .gguf file")
    at.text_input(key="model_where").set_value(str(path))
    at.button(key="model_load").click().run()
    no_exception(at)
    assert any("cut.gguf is damaged" in e and "truncated" in e for e in errors(at))
    assert "bundled" in at.session_state["ghosted.model"]["source"]  # the working model stays
    assert converted_models() == before


def save(at, target: Path | str, overwrite: bool = False):
    at.text_input(key="save_target").set_value(str(target))
    at.checkbox(key="save_overwrite").set_value(overwrite)
    return at.button(key="save_submit").click().run()


def test_the_save_box_refuses_what_it_must_and_overwrites_only_when_asked(app, tmp_path):
    calibrate(app, [20, 21], ["ghost"])
    at = open_page(app, "export")
    no_exception(at)
    target = tmp_path / "mine"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    before = snapshot(tmp_path)
    cache_before = converted_models()

    save(at, target)
    no_exception(at)
    assert any("not empty" in e for e in errors(at)) and snapshot(tmp_path) == before
    save(at, target, overwrite=True)
    no_exception(at)
    assert any("holds no saved model" in e for e in errors(at)) and snapshot(tmp_path) == before

    save(at, cache_dir() / "models" / "mine", overwrite=True)
    no_exception(at)
    assert any("Ghosted's cache" in e for e in errors(at)) and converted_models() == cache_before
    assert not (cache_dir() / "models" / "mine").exists()

    model = tmp_path / "model"
    save(at, model)
    no_exception(at)
    assert not errors(at) and any(str(model) in s.value for s in at.success)
    first = snapshot(model)
    save(at, model)
    no_exception(at)
    assert any("not empty" in e for e in errors(at)) and snapshot(model) == first
    (model / "notes.txt").write_text("the user's")
    save(at, model, overwrite=True)
    no_exception(at)
    assert not errors(at) and (model / RECIPE_FILE).exists()
    assert (model / "notes.txt").read_text() == "the user's"  # overwrite replaces the model, keeps the rest
    from ghosted.experiments.spec_files import load_spec  # the spec, as `export` saves it: that variant alone

    spec = load_spec(model)
    assert (spec.layers.drop, spec.methods) == ("20-21", ["ghost"])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
