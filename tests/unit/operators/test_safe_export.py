"""No model folder is ever overwritten, and a saved folder never loads silently without its operators.

Every test compares the files on disk before and after (names, sizes, sha256) where nothing may
change, and checks that no temporary sibling folder is left behind.
"""

from __future__ import annotations

import errno
import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import ghosted
from ghosted.models.assets import publish_folder
from ghosted.cli import main
from ghosted.models.loading import OPERATORS_FILE, RECIPE_FILE, read_recipe
from ghosted.operators.checkpoint import load_recovered, save_recovered
from ghosted.models.loading import LoadedModel, load_model
from ghosted.recovery.fitting import recover
from ghosted.data.windows import TokenWindows
from tests.tiny import random_ids, tiny_model, tiny_model_folder

IDS = random_ids(2, 12, seed=3)


# ------------------------------------------------------------------------------------- helpers
def windows(n: int = 8, length: int = 24) -> TokenWindows:
    ids = random_ids(n, length, seed=1)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random ids", "n_windows": n, "seq_len": length})


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``folder`` (hidden ones too): relative path -> (size, sha256)."""
    return {str(p.relative_to(folder)): (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def temp_siblings(folder: Path) -> list[str]:
    """Staging or moved-aside folders next to ``folder`` (there must be none after any save)."""
    return [p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}.")]


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits  # (B, T, V)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Ghosted's cache in this test's folder, so refusing it is tested without touching the real one."""
    cache = tmp_path / "ghosted-cache"
    monkeypatch.setenv("GHOSTED_CACHE", str(cache))
    return cache


@pytest.fixture(scope="module")
def run():
    """A tiny Llama with layers 2-3 removed, recovered by ghost (operators) and none (plain)."""
    return recover(tiny_model("llama"), "2-3", ["ghost", "none"], windows())


@pytest.fixture
def saved(run, tmp_path) -> Path:
    return save_recovered(run.results["ghost"].model, tmp_path / "saved", recipe=run)


# ------------------------------------------------------------------------------ refused targets
def test_a_non_empty_folder_is_refused_without_overwrite(run, tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "thesis.tex").write_text("years of work")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="not empty.*overwrite"):
        save_recovered(run.results["ghost"].model, target, recipe=run)
    with pytest.raises(ValueError, match="not empty"):
        ghosted.save(run.results["ghost"].model, target)  # the top-level API refuses alike
    assert snapshot(tmp_path) == before and temp_siblings(target) == []


def test_overwrite_replaces_a_model_folder_only(run, tmp_path):
    target = tmp_path / "documents"
    target.mkdir()
    (target / "letter.txt").write_text("not a model")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="holds no saved model.*replaces only a model folder"):
        save_recovered(run.results["ghost"].model, target, recipe=run, overwrite=True)
    assert snapshot(tmp_path) == before and temp_siblings(target) == []


def test_an_empty_folder_and_a_new_path_are_accepted(run, tmp_path):
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "new" / "deeper"):
        folder = save_recovered(run.results["ghost"].model, target, recipe=run)
        assert (folder / RECIPE_FILE).exists() and temp_siblings(folder) == []


def test_a_file_or_a_path_under_a_file_is_refused(run, tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("keep")
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="is a file"):
        save_recovered(run.results["ghost"].model, file, overwrite=True)
    with pytest.raises(ValueError, match="is a file, not a folder"):
        save_recovered(run.results["ghost"].model, file / "model")
    with pytest.raises(ValueError, match="No output folder"):
        save_recovered(run.results["ghost"].model, " ")
    assert snapshot(tmp_path) == before


def test_the_source_model_folder_is_refused_even_with_overwrite(tmp_path):
    source = tmp_path / "work" / "base"
    tiny_model("llama").save_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source).eval()  # remembers where it came from
    pruned = recover(model, "2-3", ["ghost"], windows()).results["ghost"].model
    (source / "sub").mkdir()
    before = snapshot(tmp_path)
    for target, words in [(source, "it is the folder the model was loaded from"),
                          (source / "sub", "it is inside the folder the model was loaded from"),
                          (source / ".." / "base", "it is the folder"),  # resolved, not compared as text
                          (source.parent, "it contains the folder the model was loaded from")]:
        with pytest.raises(ValueError, match=words):
            save_recovered(pruned, target, overwrite=True)
    assert snapshot(tmp_path) == before and temp_siblings(source) == []


def test_the_folder_of_a_loaded_model_is_refused(tmp_path):
    """The LoadedModel passed as tokenizer names the source even when the model does not."""
    source = tmp_path / "base"
    source.mkdir()
    (source / "weights.bin").write_bytes(b"precious")
    model = tiny_model("llama")  # built in memory: no _name_or_path
    lm = LoadedModel(model=model, tokenizer=None, source=str(source), kind="folder", device="cpu",
                     dtype="float32", load_seconds=0.0)
    pruned = recover(model, "2-3", ["none"], windows()).results["none"].model
    before = snapshot(tmp_path)
    with pytest.raises(ValueError, match="folder the model was loaded from"):
        save_recovered(pruned, source, lm, overwrite=True)
    assert snapshot(tmp_path) == before


def test_the_cache_is_refused_even_with_overwrite(run, own_cache, tmp_path):
    converted = own_cache / "models" / "b179c9523d0e6a0f"  # where the bundled model is converted to
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}")
    before = snapshot(tmp_path)
    for target, words in [(converted, "is inside Ghosted's cache"), (own_cache, "is Ghosted's cache"),
                          (own_cache / "elsewhere", "inside Ghosted's cache"),
                          (tmp_path, "contains Ghosted's cache")]:
        with pytest.raises(ValueError, match=words):
            save_recovered(run.results["ghost"].model, target, overwrite=True)
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------- overwrite, faults
def test_overwrite_replaces_the_model_keeps_the_users_files_and_leaves_no_temporary_folder(run, saved):
    (saved / "notes.txt").write_text("the user's, next to an earlier export")
    assert OPERATORS_FILE in read_recipe(saved)["files"]  # the earlier export's, listed by its recipe
    folder = save_recovered(run.results["none"].model, saved, recipe=run, overwrite=True)
    names = {p.name for p in folder.iterdir()}
    assert OPERATORS_FILE not in names and RECIPE_FILE in names  # Ghosted's stale file went
    assert (folder / "notes.txt").read_text() == "the user's, next to an earlier export"
    assert temp_siblings(folder) == [] and sorted(p.name for p in saved.parent.iterdir()) == ["ghosted-cache", "saved"]
    assert torch.equal(logits(load_recovered(folder, device="cpu").model), logits(run.results["none"].model))


@pytest.mark.parametrize("fault", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_a_failed_save_leaves_the_previous_folder_intact(run, saved, monkeypatch, fault):
    before = snapshot(saved)
    model = run.results["none"].model
    real = type(model).save_pretrained

    def half_then_fail(self, folder, **kwargs):
        real(self, folder, **kwargs)  # the weights are written...
        raise fault  # ... and then the save dies

    monkeypatch.setattr(type(model), "save_pretrained", half_then_fail)
    with pytest.raises(type(fault)):
        save_recovered(model, saved, recipe=run, overwrite=True)
    with pytest.raises(type(fault)):
        save_recovered(model, saved.parent / "fresh", recipe=run)
    assert snapshot(saved) == before and temp_siblings(saved) == []
    assert not (saved.parent / "fresh").exists() and temp_siblings(saved.parent / "fresh") == []


def test_a_failed_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    import ghosted.models.assets as assets

    target, staged = tmp_path / "w" / "model", tmp_path / "w" / ".model.tmp-1"
    target.mkdir(parents=True)
    (target / "old.txt").write_text("old")
    staged.mkdir()
    (staged / "new.txt").write_text("new")
    real = assets.os.rename

    def rename(src, dst):
        if Path(src) == staged:
            raise OSError("device busy")
        return real(src, dst)

    monkeypatch.setattr(assets.os, "rename", rename)
    with pytest.raises(OSError, match="busy"):
        publish_folder(staged, target)
    assert snapshot(target) == {"old.txt": (3, hashlib.sha256(b"old").hexdigest())}
    assert sorted(p.name for p in target.parent.iterdir()) == [".model.tmp-1", "model"]


def test_leftovers_of_a_killed_save_are_cleaned_and_a_moved_aside_folder_restored(run, tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    work = tmp_path / "w"
    target = work / "model"
    (work / f".model.tmp-{dead}").mkdir(parents=True)  # killed while writing
    aside = work / f".model.old-{dead}"  # killed between moving the old folder aside and renaming
    aside.mkdir()
    (aside / "config.json").write_text("{}")
    (work / "model.tmp-7").mkdir()  # not ours (no leading dot): never touched
    from ghosted.models.assets import remove_stale_temps

    remove_stale_temps(target)
    assert snapshot(target) == {"config.json": (2, hashlib.sha256(b"{}").hexdigest())}
    assert sorted(p.name for p in work.iterdir()) == ["model", "model.tmp-7"]


# ------------------------------------------------------------------------ recipe and checksums
def test_the_recipe_lists_every_operator_file_with_its_sha256(run, saved, tmp_path):
    file = saved / OPERATORS_FILE
    expected = {"name": OPERATORS_FILE, "sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
                "bytes": file.stat().st_size}
    recipe = read_recipe(saved)
    assert recipe["operator_files"] == [expected] and recipe["format_version"] == 2
    plain = save_recovered(run.results["none"].model, tmp_path / "plain", recipe=run)
    assert read_recipe(plain)["operator_files"] == []


def test_a_changed_operator_file_is_refused(saved):
    file = saved / OPERATORS_FILE
    data = bytearray(file.read_bytes())
    data[-3] ^= 0xFF  # one flipped byte in the last tensor: same size, other numbers
    file.write_bytes(bytes(data))
    before = snapshot(saved)
    with pytest.raises(ValueError, match=f"{OPERATORS_FILE} has changed.*sha256"):
        load_recovered(saved, device="cpu")
    with pytest.raises(ValueError, match="has changed"):
        ghosted.load(str(saved), device="cpu")
    file.write_bytes(bytes(data) + b"\0")  # and one byte more: refused by its size
    with pytest.raises(ValueError, match="size or sha256"):
        load_recovered(saved, device="cpu")
    assert snapshot(saved).keys() == before.keys()


def test_a_missing_operator_file_is_refused(saved):
    (saved / OPERATORS_FILE).unlink()
    before = snapshot(saved)
    with pytest.raises(FileNotFoundError, match=f"{OPERATORS_FILE} is missing.*without its recovery"):
        load_recovered(saved, device="cpu")
    with pytest.raises(FileNotFoundError, match="is missing"):
        ghosted.load(str(saved), device="cpu")
    assert snapshot(saved) == before


def test_operators_without_a_recipe_are_refused(saved):
    (saved / RECIPE_FILE).unlink()
    before = snapshot(saved)
    for load in (lambda: load_recovered(saved, device="cpu"), lambda: ghosted.load(str(saved), device="cpu"),
                 lambda: load_model(str(saved), device="cpu")):
        with pytest.raises(ValueError, match=f"no {RECIPE_FILE}.*Export the model again"):
            load()
    assert snapshot(saved) == before


def test_a_stray_operator_file_next_to_a_plain_recipe_is_refused(run, tmp_path, saved):
    plain = save_recovered(run.results["none"].model, tmp_path / "plain", recipe=run)
    (plain / OPERATORS_FILE).write_bytes((saved / OPERATORS_FILE).read_bytes())
    with pytest.raises(ValueError, match="not listed in"):
        load_recovered(plain, device="cpu")


@pytest.mark.parametrize("content, words", [
    ('{"format": "ghosted-recipe", "operators": [', "not valid JSON"),
    ("[1, 2]", "a JSON object was expected"),
    ('{"operator_files": "ghosted_operators.safetensors"}', "operator_files is not a list"),
    (b"\xff\xfe not text", "not valid JSON"),
])
def test_a_corrupt_recipe_is_refused(saved, content, words):
    recipe = saved / RECIPE_FILE
    recipe.write_bytes(content.encode() if isinstance(content, str) else content)
    before = snapshot(saved)
    with pytest.raises(ValueError, match=f"{RECIPE_FILE} is damaged \\({words}"):
        load_recovered(saved, device="cpu")
    with pytest.raises(ValueError, match="is damaged"):
        ghosted.load(str(saved), device="cpu")
    assert snapshot(saved) == before


def test_a_corrupt_operator_file_is_refused(saved):
    """A recipe of format 1 has no checksums: the damaged file itself is reported."""
    recipe = read_recipe(saved)
    del recipe["operator_files"]
    (saved / RECIPE_FILE).write_text(json.dumps(recipe))
    (saved / OPERATORS_FILE).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    with pytest.raises(ValueError, match=f"{OPERATORS_FILE} is damaged"):
        load_recovered(saved, device="cpu")


def test_a_format_1_folder_still_loads(run, saved):
    recipe = read_recipe(saved)
    del recipe["operator_files"]
    (saved / RECIPE_FILE).write_text(json.dumps(recipe))
    loaded = load_recovered(saved, device="cpu")
    assert loaded.extra["operators"] == 1
    assert torch.equal(logits(loaded.model), logits(run.results["ghost"].model))


# ----------------------------------------------------------------------------------------- CLI
@pytest.fixture
def model_folder(tmp_path) -> Path:
    """A tiny Llama with a word-level tokenizer: the CLI can load and calibrate it in a second."""
    return tiny_model_folder(tmp_path / "base")


@pytest.fixture
def no_loading(monkeypatch):
    """Any model load fails the test: the targets must be refused before it."""
    def fail(*_):
        raise AssertionError("the model was loaded before the output target was checked")

    for name in ("export", "influence", "grid"):
        monkeypatch.setattr(f"ghosted.cli.{name}.load_from_args", fail)
    monkeypatch.setattr("ghosted.experiments.session.load_spec_model", fail)  # run: its session loads the model


def bad_target_cases(tmp_path: Path, model: Path, cache: Path) -> list[tuple[list[str], str]]:
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("keep")
    file = tmp_path / "file.txt"
    file.write_text("keep")
    export = ["export", "--model", str(model), "--drop", "2-3", "--out"]
    return [
        ([*export, str(full)], "is not empty: choose a new folder, or pass --overwrite"),
        ([*export, str(full), "--overwrite"], "holds no saved model"),
        ([*export, str(file)], "is a file, not a folder"),
        ([*export, str(file / "model")], "file.txt is a file, not a folder"),
        ([*export, str(model), "--overwrite"], "is the folder the model was loaded from"),
        ([*export, str(model / "pruned")], "is inside the folder the model was loaded from"),
        ([*export, str(cache / "models" / "x"), "--overwrite"], "inside Ghosted's cache"),
        (["run", "--model", str(model), "--drop", "2", "--out", str(full)], "is a folder; name a file"),
        (["run", "--model", str(model), "--drop", "2", "--out", str(tmp_path / "new") + "/"], "is a folder"),
        (["run", "--model", str(model), "--drop", "2", "--out", str(file / "r.json")], "is a file, not a folder"),
        (["influence", "--model", str(model), "--out-dir", str(file)], "is a file, not a folder"),
        (["grid", "--model", str(model), "--out-dir", str(file / "grid")], "is a file, not a folder"),
    ]


def test_cli_refuses_bad_targets_before_loading_the_model(model_folder, own_cache, tmp_path, no_loading,
                                                          capsys):
    (own_cache / "models" / "x").mkdir(parents=True)
    cases = bad_target_cases(tmp_path, model_folder, own_cache)
    before = snapshot(tmp_path)
    for argv, words in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and words in err, (argv, err)
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "new").exists()


def test_cli_refuses_the_bundled_model_folder(no_loading, capsys):
    from ghosted.models.assets import bundled_gguf_path

    try:
        folder = bundled_gguf_path().parent
    except FileNotFoundError:
        pytest.skip("the bundled model is not installed")
    before = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())
    assert main(["export", "--drop", "2", "--out", str(folder), "--overwrite"]) == 2
    assert "is the folder the model was loaded from" in capsys.readouterr().err
    assert sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()) == before


EXPORT = ["export", "--drop", "2-3", "--calib-seqs", "4", "--seq-len", "32", "--heldout-seqs", "0", "--device", "cpu"]


def test_cli_export_overwrite_replaces_the_model_and_keeps_the_users_files(model_folder, tmp_path, capsys):
    """``export --overwrite`` used to delete every file the user had put next to a saved model."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")  # an older model, saved before recipes listed their files
    (out / "ghosted_operators.safetensors").write_bytes(b"old operators")
    (out / "old.txt").write_text("old")
    (out / "eval").mkdir()
    (out / "eval" / "scores.csv").write_text("a,b\n")
    source = snapshot(model_folder)
    code = main([*EXPORT, "--model", str(model_folder), "--method", "ghost", "--out", str(out), "--overwrite"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert (out / "old.txt").read_text() == "old" and (out / "eval" / "scores.csv").read_text() == "a,b\n"
    assert "old.txt" in captured.out and "not Ghosted's: kept" in captured.out
    recipe = read_recipe(out)
    assert recipe["operator_files"][0]["name"] == OPERATORS_FILE and "old.txt" not in recipe["files"]
    assert temp_siblings(out) == [] and snapshot(model_folder) == source
    assert load_recovered(out, device="cpu").extra["operators"] == 1
    code = main([*EXPORT, "--model", str(model_folder), "--method", "replaceme-ls", "--out", str(out), "--overwrite"])
    assert code == 0, capsys.readouterr().err  # folds into the weights: no operator file this time
    assert not (out / OPERATORS_FILE).exists() and (out / "old.txt").read_text() == "old"
    assert (out / "eval" / "scores.csv").exists()


@pytest.mark.parametrize("failure", ["disk full", "safetensors"])
def test_an_export_that_cannot_be_written_says_why_and_leaves_the_previous_folder(model_folder, tmp_path, capsys,
                                                                                  monkeypatch, failure):
    from safetensors import SafetensorError

    from ghosted.operators import checkpoint

    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)

    def full(*args, **kwargs):  # a full disk, simulated: root ignores chmod and this runs as root in CI
        if failure == "disk full":
            raise OSError(errno.ENOSPC, "No space left on device")
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
    monkeypatch.setattr(checkpoint, "save_file", full)
    code = main([*EXPORT, "--model", str(model_folder), "--method", "ghost", "--out", str(out), "--overwrite"])
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("error: ")]  # after the progress bars
    assert code == 2 and len(said) == 1 and "Traceback" not in err
    assert "Could not save the model" in said[0] and "left as it was" in said[0]
    assert ("No space left" if failure == "disk full" else "StorageFull") in said[0]
    assert snapshot(out) == before and temp_siblings(out) == []


def test_the_command_line_loads_a_saved_folder_with_its_operators(run, saved):
    """``--model SAVED_FOLDER`` gets the recovered model back, never the plain pruned weights."""
    from ghosted.cli import build_parser
    from ghosted.cli.common import load_from_args

    args = build_parser().parse_args(["run", "--model", str(saved), "--device", "cpu", "--dtype", "float32"])
    lm = load_from_args(args)
    assert lm.extra["operators"] > 0
    assert torch.equal(logits(lm.model), logits(run.results["ghost"].model))  # same machine, same ops
    assert not torch.equal(logits(lm.model), logits(run.results["none"].model))
