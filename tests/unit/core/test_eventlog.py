"""Operators' logs: one JSON line per event, written however the timed block ends, never stopping the server."""

from __future__ import annotations

import json

import pytest

from ghosted.core import eventlog


def test_log_path_is_none_unless_set(monkeypatch):
    monkeypatch.setenv("GHOSTED_PAGE_LOG", "  ")
    assert eventlog.log_path("GHOSTED_PAGE_LOG") is None
    monkeypatch.setenv("GHOSTED_PAGE_LOG", "/tmp/pages.jsonl")
    assert eventlog.log_path("GHOSTED_PAGE_LOG") == "/tmp/pages.jsonl"


def test_timed_logs_a_block_that_raises(tmp_path):
    log = tmp_path / "pages.jsonl"
    with pytest.raises(KeyError), eventlog.timed(str(log), page="Compare"):
        raise KeyError("a rerun stops the page")
    with eventlog.timed(str(log), page="Model"):
        pass
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["page"] for line in lines] == ["Compare", "Model"]
    assert all(line["seconds"] >= 0 and line["started"] > 0 for line in lines)


def test_timed_without_a_log_writes_nothing(tmp_path):
    with eventlog.timed(None, page="Model"):
        pass
    assert not list(tmp_path.iterdir())


def test_an_unwritable_log_warns_and_returns_false(tmp_path):
    with pytest.warns(RuntimeWarning, match="Could not write the log"):
        assert eventlog.append(str(tmp_path / "missing" / "log.jsonl"), {"a": 1}) is False
