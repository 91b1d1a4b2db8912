"""A deployment without local paths (the demo, the classroom) reads no file of the server: only bundled
texts, uploads, and dataset names that cannot be paths (the classroom's dataset box once read any file of
the server by a relative path)."""

from __future__ import annotations

import pytest

from ghosted.data.sources import is_hub_dataset_name
from ghosted.service.deploy import CLASSROOM, DEMO, LOCAL, DeployRefusal

SERVER_FILES = ["README.md", "docs/RELIABILITY.md", "ghosted", "pyproject.toml", "../etc/passwd", "/etc/passwd",
                "~/.bashrc", "hf:ghosted", "hf:docs", "hf:../x", "hf:/etc", "hf:text", "hf:json", "hf:csv",
                "hf:script.py", "hf:a/b/c", "hf:owner/name:../x", "bundled:../x", "calib.txt", "x.jsonl"]
DATASETS = ["wikitext-2-raw-v1", "c4", "ptb", "hf:allenai/c4:en", "hf:wikitext:wikitext-2-raw-v1",
            "hf:HuggingFaceFW/fineweb-edu"]


@pytest.mark.parametrize("name", SERVER_FILES)
def test_the_classroom_refuses_anything_that_can_be_a_path(name, monkeypatch, request):
    monkeypatch.chdir(request.config.rootpath)  # where the app runs: README.md and ghosted/ exist here
    with pytest.raises(DeployRefusal, match="does not read files on the server"):
        CLASSROOM.check_text_source(name)
    with pytest.raises(DeployRefusal):
        DEMO.check_text_source(name)


@pytest.mark.parametrize("name", DATASETS + ["bundled:news", "bundled:wiki"])
def test_the_classroom_takes_bundled_texts_and_dataset_names(name):
    CLASSROOM.check_text_source(name)


def test_a_workstation_still_reads_local_files(request, monkeypatch):
    monkeypatch.chdir(request.config.rootpath)
    for name in ("README.md", "docs/RELIABILITY.md", "/etc/hostname", "calib.txt"):
        LOCAL.check_text_source(name)


def test_a_dataset_name_that_exists_as_a_local_folder_is_no_dataset_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_dataset_name("hf:owner/name")
    (tmp_path / "owner" / "name").mkdir(parents=True)  # datasets.load_dataset would read this folder
    assert not is_hub_dataset_name("hf:owner/name")
