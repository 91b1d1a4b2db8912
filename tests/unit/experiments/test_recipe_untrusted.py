"""A recipe is untrusted input: each field is checked like its flag (type, choice; one line and exit 2 on the
command line, TypeError/ValueError in the API), a file of any size or kind is read within a bound, and
``trust_remote_code`` is never taken from a file, nor does ``--dry-run`` ever run a model folder's code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ghosted.cli import main
from ghosted.experiments.spec import ExperimentSpec
from ghosted.experiments.spec_files import load_spec
from tests.properties import bounded_memory


def spec_with(section: str, key: str, value) -> dict:
    data = ExperimentSpec().with_options(drop="20-26", eval_tokens=1024, eval_seq_len=128).to_dict()
    data[section][key] = value
    return data


def write_recipe(folder: Path, spec: dict) -> Path:
    file = folder / "results.json"
    file.write_text(json.dumps({"spec": spec}))
    return file


# The cases of issue 22: each was run, or crashed with a traceback, before.
FIELD_CASES = [
    ("calibration", "cache", "no", TypeError, r"calibration\.cache' \(--no-cache\).*true or false"),
    ("recovery", "fold", "false", TypeError, r"recovery\.fold' \(--no-fold\).*true or false"),
    ("calibration", "calib_seqs", "32", TypeError, r"calibration\.calib_seqs' \(--calib-seqs\).*whole number"),
    ("calibration", "calib_seqs", None, TypeError, r"calibration\.calib_seqs' \(--calib-seqs\).*not null"),
    ("calibration", "calib_seqs", 32.0, TypeError, "whole number"),
    ("calibration", "seed", True, TypeError, "whole number"),
    ("recovery", "ghost_mode", "paralel", ValueError, r"ghost_mode' \(--ghost-mode\) .*'paralel'; choose from "
                                                      "independent, sequential"),
    ("recovery", "granularity", "blocks", ValueError, "choose from auto, block, layer"),
    ("recovery", "solver", 3, TypeError, "a string"),
    ("recovery", "eps", "1e-6", TypeError, "a number"),
    ("evaluation", "protocol", "papers", ValueError, "choose from"),
    ("evaluation", "tasks", "bundled-lastword", TypeError, "a list of strings"),
    ("layers", "drop", [20, 21], TypeError, "a string"),
    ("model", "source", None, TypeError, "a string"),
]


@pytest.mark.parametrize("section, key, value, kind, words", FIELD_CASES)
def test_a_field_of_the_wrong_kind_or_choice_is_refused_in_the_api(section, key, value, kind, words):
    with pytest.raises(kind, match=words):
        ExperimentSpec.from_dict(spec_with(section, key, value))


@pytest.mark.parametrize("section, key, value, kind, words", FIELD_CASES)
def test_a_field_of_the_wrong_kind_or_choice_is_one_line_and_exit_2(tmp_path, capsys, section, key, value, kind,
                                                                    words):
    file = write_recipe(tmp_path, spec_with(section, key, value))
    assert main(["run", "--recipe", str(file), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {file}: ") and err.count("\n") == 1 and "Traceback" not in err


def test_a_list_where_an_object_goes_is_refused(tmp_path, capsys):
    data = spec_with("layers", "drop", "20-26")
    data["calibration"] = [1, 2]
    with pytest.raises(TypeError, match="'spec.calibration' .* must be a JSON object, not list"):
        ExperimentSpec.from_dict(data)
    assert main(["run", "--recipe", str(write_recipe(tmp_path, data)), "--dry-run"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_whole_number_is_a_number_and_a_bad_field_is_refused_even_under_a_flag(tmp_path):
    spec = ExperimentSpec.from_dict(spec_with("recovery", "eps", 1))  # a whole number is a number, as --eps 1
    assert spec.recovery.eps == 1.0 and isinstance(spec.recovery.eps, float)
    file = write_recipe(tmp_path, spec_with("recovery", "ghost_mode", "paralel"))
    # the file is read whole: a flag over a bad field does not make the file good
    assert main(["run", "--recipe", str(file), "--ghost-mode", "sequential", "--dry-run"]) == 2


def test_trust_remote_code_is_never_taken_from_a_file(tmp_path):
    with pytest.warns(UserWarning, match="never taken from a file.*--trust-remote-code"):
        spec = load_spec(write_recipe(tmp_path, spec_with("model", "trust_remote_code", True)))
    assert spec.model.trust_remote_code is False


def test_a_recipe_file_is_read_within_a_bound(tmp_path):
    huge = tmp_path / "huge.json"
    with huge.open("wb") as handle:  # a sparse 4 GB file: reading it whole once exhausted memory
        handle.truncate(4 * 2**30)
    with bounded_memory(), pytest.raises(ValueError, match="huge.json is .* bytes; at most"):
        load_spec(huge)


def remote_code_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A model folder whose config class is Python shipped with it; importing it writes ``marker``."""
    folder, marker = tmp_path / "custom-model", tmp_path / "code-ran"
    folder.mkdir()
    (folder / "configuration_custom.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import LlamaConfig\n\n\nclass CustomConfig(LlamaConfig):\n    model_type = 'custom'\n")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "custom", "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"},
        "num_hidden_layers": 6, "hidden_size": 32, "max_position_embeddings": 128}))
    return folder, marker


def test_dry_run_never_runs_a_model_folders_code(tmp_path, capsys):
    folder, marker = remote_code_folder(tmp_path)
    code = main(["run", "--model", str(folder), "--trust-remote-code", "--drop", "2-3", "--calib-seqs", "2",
                 "--eval-tokens", "128", "--eval-seq-len", "64", "--seq-len", "32", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and not marker.exists()
    assert "6 layers" in out and "layers to drop: 2-3" in out


def test_loading_with_remote_code_warns_naming_the_folder(tmp_path):
    from ghosted.models.loading import load_model

    folder, _ = remote_code_folder(tmp_path)
    with pytest.warns(UserWarning, match=f"runs the Python code shipped with the folder {folder.resolve()}"):
        with pytest.raises(Exception):  # this folder has no weights; the warning comes before any code runs
            load_model(str(folder), device="cpu", trust_remote_code=True)
