"""Ghosted replaces only files it wrote: ``run --out``, ``grid``/``influence --out-dir``, a grid's journal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ghosted.cli import main
from ghosted.core.ownership import OUTPUT_MARKER, RESULTS_STAMP, written_by_ghosted
from ghosted.grid.journal import GridJournal
from tests.tiny import tiny_loaded, tiny_model_folder

RUN = ["run", "--drop", "2-3", "--methods", "dense,none", "--calib-seqs", "4", "--seq-len", "32", "--heldout-seqs", "0",
       "--eval-tokens", "64", "--eval-seq-len", "32", "--batch-size", "2", "--device", "cpu", "--dtype", "float32"]
GRID = ["grid", "--selections", "streamline", "--n", "2", "--methods", "none", "--evals", "bundled:wiki",
        "--calib-seqs", "4", "--seq-len", "32", "--heldout-seqs", "0", "--eval-tokens", "64", "--eval-seq-len", "32",
        "--batch-size", "2", "--device", "cpu", "--dtype", "float32"]


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def tiny_cli(monkeypatch):
    """``run`` and ``grid`` on a tiny in-memory model (no load from disk)."""
    monkeypatch.setattr("ghosted.cli.grid.load_from_args", lambda *_: tiny_loaded(6))
    monkeypatch.setattr("ghosted.experiments.session.load_spec_model", lambda *_: tiny_loaded(6))  # run's session


def one_line_refusal(capsys, *words) -> None:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


def test_run_out_never_writes_into_the_models_folder(tmp_path, capsys, monkeypatch):
    """``run --out <model>/config.json`` used to replace the model's config: the model no longer loaded."""
    model = tiny_model_folder(tmp_path / "model")
    before = files(model)
    capsys.readouterr()
    monkeypatch.setattr("ghosted.experiments.session.load_spec_model", lambda *_: pytest.fail("loaded before refusing"))
    for extra in ([], ["--overwrite"]):
        assert main([*RUN, "--model", str(model), "--out", str(model / "config.json"), *extra]) == 2
        one_line_refusal(capsys, "inside the folder the model was loaded from")
        assert main([*RUN, "--model", str(model), "--out", str(model / "results.json"), *extra]) == 2
        one_line_refusal(capsys, "inside the folder the model was loaded from")
    assert files(model) == before


def test_run_out_replaces_only_its_own_results_unless_told(tmp_path, capsys, tiny_cli):
    theirs = tmp_path / "notes.json"
    theirs.write_text('{"my": "notes"}')
    capsys.readouterr()
    assert main([*RUN, "--out", str(theirs)]) == 2
    one_line_refusal(capsys, "not a results file Ghosted wrote", "--overwrite")
    assert theirs.read_text() == '{"my": "notes"}'
    ours = tmp_path / "results.json"
    assert main([*RUN, "--out", str(ours)]) == 0
    first = json.loads(ours.read_text())
    assert first["ghosted"] == RESULTS_STAMP and written_by_ghosted(ours)
    assert main([*RUN, "--out", str(ours), "--seed", "3"]) == 0  # its own file: replaced without a flag
    assert json.loads(ours.read_text())["config"]["seed"] == 3
    assert main([*RUN, "--out", str(theirs), "--overwrite"]) == 0  # the user said so
    assert written_by_ghosted(theirs)
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []  # written atomically


def test_grid_never_deletes_an_earlier_journal_without_resume_or_overwrite(tmp_path, capsys, tiny_cli):
    """Rerunning ``grid`` into a folder used to delete its journal at once: a Ctrl-C then left nothing."""
    out = tmp_path / "grid"
    assert main([*GRID, "--out-dir", str(out)]) == 0
    assert (out / OUTPUT_MARKER).exists()
    capsys.readouterr()
    journal = (out / "grid.jsonl").read_bytes()
    assert main([*GRID, "--out-dir", str(out), "--seed", "4"]) == 2
    one_line_refusal(capsys, "grid.jsonl", "--resume", "--overwrite")
    assert (out / "grid.jsonl").read_bytes() == journal
    assert main([*GRID, "--out-dir", str(out), "--resume"]) == 0  # kept and extended
    assert (out / "grid.jsonl").read_bytes().startswith(journal)


def test_overwrite_replaces_the_journal_only_when_the_first_new_part_is_written(tmp_path):
    GridJournal(tmp_path).add("cell", "old settings", {"layers": [1]}, rows=[])
    old = (tmp_path / "grid.jsonl").read_bytes()
    with pytest.raises(ValueError, match="--resume"):
        GridJournal(tmp_path)
    journal = GridJournal(tmp_path, overwrite=True)  # stopped here, the earlier journal is all there is
    assert (tmp_path / "grid.jsonl").read_bytes() == old and journal.records == []
    journal.add("cell", "new settings", {"layers": [2]}, rows=[])
    lines = (tmp_path / "grid.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["settings"] == "new settings"
    journal.add("cell", "new settings", {"layers": [3]}, rows=[])
    assert len((tmp_path / "grid.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("command, name", [("grid", "grid.csv"), ("influence", "blocks.csv")])
def test_an_output_folder_with_files_ghosted_did_not_write_is_refused(tmp_path, capsys, monkeypatch, command, name):
    out = tmp_path / "results"
    out.mkdir()
    (out / name).write_text("my own table\n")
    monkeypatch.setattr(f"ghosted.cli.{command}.load_from_args", lambda *_: pytest.fail("loaded before refusing"))
    assert main([command, "--out-dir", str(out), "--device", "cpu"]) == 2
    one_line_refusal(capsys, name, "Ghosted did not write", "--overwrite")
    assert files(out) == {name: b"my own table\n"}
