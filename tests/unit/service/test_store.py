"""The shared result store: keys from requests, a bounded memory, idle results released, JSON files on disk
read back as untrusted input."""

from __future__ import annotations

import json

import pytest

from ghosted.service.store import PREFIX, Codec, ResultStore, request_key

JSON_CODEC = {"table": Codec(encode=lambda rows: {"rows": rows}, decode=lambda data: list(data["rows"]))}


def test_keys_name_every_field_and_ignore_their_order():
    a = request_key("fit", {"model": "m", "layers": [3, 4], "seed": 0})
    assert a == request_key("fit", {"seed": 0, "layers": [3, 4], "model": "m"})
    assert a != request_key("fit", {"model": "m", "layers": [3, 5], "seed": 0})
    assert a != request_key("evaluate", {"model": "m", "layers": [3, 4], "seed": 0})
    assert a.startswith("fit-")


def test_memory_is_bounded_least_recently_used_first():
    store = ResultStore(max_entries=2)
    store.put("a", 1)
    store.put("b", 2)
    assert store.get("a") == 1  # a is now the most recent
    store.put("c", 3)
    assert store.keys() == ["a", "c"] and store.get("b") is None


def test_results_no_one_reads_are_released_after_the_idle_time():
    now = [0.0]
    store = ResultStore(idle_s=60, clock=lambda: now[0])
    store.put("old", "x")
    store.put("read", "y")
    now[0] = 50.0
    assert store.get("read") == "y"
    now[0] = 100.0
    assert store.release_idle() == ["old"]
    assert store.get("read") == "y" and store.get("old") is None


def test_a_result_with_a_codec_survives_a_restart(tmp_path):
    ResultStore(folder=tmp_path, codecs=JSON_CODEC).put("table-1", [1, 2], kind="table")
    ResultStore(folder=tmp_path, codecs=JSON_CODEC).put("other-1", object(), kind="model")  # no codec: memory only
    assert [p.name for p in tmp_path.iterdir()] == [f"{PREFIX}table-1.json"]
    fresh = ResultStore(folder=tmp_path, codecs=JSON_CODEC)
    assert fresh.get("table-1") == [1, 2] and fresh.get("other-1") is None


@pytest.mark.parametrize("content", ["not json", json.dumps([1]), json.dumps({"key": "table-2", "format": 1}),
                                     json.dumps({"key": "table-1", "format": 1, "kind": "pickle", "result": {}}),
                                     json.dumps({"key": "table-1", "format": 99, "kind": "table", "result": {}})])
def test_a_broken_or_foreign_file_is_ignored_with_a_warning(tmp_path, content):
    (tmp_path / f"{PREFIX}table-1.json").write_text(content)
    with pytest.warns(RuntimeWarning, match="unreadable stored result"):
        assert ResultStore(folder=tmp_path, codecs=JSON_CODEC).get("table-1") is None


def test_a_folder_that_cannot_be_written_keeps_the_result_in_memory(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    store = ResultStore(folder=blocked, codecs=JSON_CODEC)
    with pytest.warns(RuntimeWarning, match="kept in memory only"):
        store.put("table-1", [1], kind="table")
    assert store.get("table-1") == [1]


def test_max_entries_must_be_positive():
    with pytest.raises(ValueError, match="max_entries"):
        ResultStore(max_entries=0)


@pytest.mark.parametrize("write, why", [
    (lambda path: path.write_bytes(b" " * (33 * 2**20)), "over the"),  # too large: never read
    (lambda path: path.write_text(json.dumps({"key": "table-1", "format": 1, "kind": "graph", "result": 1})),
     "not the kind its key names"),
    (lambda path: path.write_text('{"key": "table-1", "format": 1, "kind": "table", "result": '
                                  + "[" * 100_000 + "]" * 100_000 + "}"), "deep|recursion"),
    (lambda path: path.write_text(json.dumps({"key": "table-1", "format": 1, "kind": "table", "result": [[1]] * 3})),
     "deeper|nested"),
])
def test_a_crafted_entry_is_skipped_with_a_warning_for_the_operator_never_an_error(tmp_path, caplog, write, why):
    import re

    from ghosted.service.store import Codec

    def strict(data):  # a decoder that trips over a wrong type, as a real one may
        return [int(x) for x in data]

    write(tmp_path / f"{PREFIX}table-1.json")
    store = ResultStore(folder=tmp_path, codecs={"table": Codec(list, strict), "graph": Codec(list, list)})
    with pytest.warns(RuntimeWarning, match="unreadable stored result"):
        assert store.get("table-1") is None
    assert any(re.search(why, r.getMessage(), re.I) or r.levelname == "WARNING" for r in caplog.records)
