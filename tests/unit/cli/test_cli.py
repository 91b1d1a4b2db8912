"""The command line: help texts and a small end-to-end run on the bundled model."""

import json
import os
import subprocess
import sys

import pytest

from ghosted.cli import build_parser, main

RUN_FLAGS = ["--model", "--calib", "--eval", "--calib-seqs", "--seq-len", "--eval-tokens", "--eval-seq-len",
             "--device", "--dtype", "--seed", "--drop", "--methods", "--out", "--ghost-mode"]


def test_top_level_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "run" in capsys.readouterr().out


def test_run_help_documents_every_flag():
    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    for flag in RUN_FLAGS:
        assert flag in text


def test_bad_layer_spec_is_a_clear_error(capsys, bundled):
    code = main(["run", "--drop", "28-40", "--methods", "none", "--eval-tokens", "256", "--eval-seq-len", "256"])
    assert code == 2
    assert "do not exist" in capsys.readouterr().err


@pytest.mark.slow  # a whole run of the bundled model in a new process
def test_run_writes_json_with_every_method(tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "ghosted", "run", "--drop", "20-26", "--methods", "dense,none,ghost,replaceme-ls",
           "--calib-seqs", "4", "--seq-len", "64", "--heldout-seqs", "2", "--eval-tokens", "512",
           "--eval-seq-len", "256", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["dropped"] == list(range(20, 27))
    assert [e["method"] for e in report["results"]] == ["dense", "none", "ghost", "replaceme-ls"]
    assert all(e["ppl"] > 1 for e in report["results"])
    ghost = report["results"][2]
    assert {"calib_seconds", "solve_seconds", "heldout_boundary_error"} <= set(ghost)
    assert report["protocol"]["evaluation"]["scored_tokens"] == 2 * 255
    assert "ppl" in proc.stdout and "evaluation:" in proc.stdout
