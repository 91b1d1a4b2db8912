"""A saved folder is untrusted input: real folders (a tiny model with its operators, saved once) are
mutated (the recipe's bytes and fields, the operator file crafted with a matching checksum, the weights,
the paths the recipe names) and loading answers with a model that has its operators, or a documented
error with a message, within a bounded memory; and it never reads outside the folder."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from ghosted.data.windows import TokenWindows
from ghosted.models.loading import OPERATORS_FILE, RECIPE_FILE, ModelLoadError
from ghosted.operators.checkpoint import load_recovered, save_recovered
from ghosted.operators.sites import operators_of
from ghosted.recovery.fitting import recover
from tests.properties import assert_refusal, bounded_memory, examples
from tests.tiny import random_ids, tiny_model

REFUSALS = (ValueError, TypeError, FileNotFoundError, ModelLoadError)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**64), st.floats(), st.text(max_size=10))
JSON = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                    max_leaves=8)


@pytest.fixture(scope="session")
def saved_folder(tmp_path_factory) -> Path:
    """A tiny Llama with layers 2-3 removed and a ghost operator, saved once per session."""
    ids = random_ids(8, 24, seed=1)
    calib = TokenWindows(ids, torch.ones_like(ids), {"source": "random ids", "n_windows": 8, "seq_len": 24})
    run = recover(tiny_model("llama"), "2-3", ["ghost"], calib)
    return save_recovered(run.results["ghost"].model, tmp_path_factory.mktemp("fuzz") / "saved", recipe=run)


def loaded_or_refused(folder: Path):
    """load_recovered under the memory bound: the loaded model, or the refusal it raised."""
    with bounded_memory(2048):
        try:
            return load_recovered(folder, device="cpu")
        except REFUSALS as err:
            return err


def check(out, operators: int | None = None) -> None:
    if isinstance(out, BaseException):
        assert_refusal(out, REFUSALS)
        return
    attached = len(list(operators_of(out.model)))
    assert attached == out.extra["operators"] and (operators is None or attached == operators)


def copy_of(saved: Path, into: str) -> Path:
    folder = Path(into) / "saved"
    shutil.copytree(saved, folder)
    return folder


def sha256(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def relist(folder: Path) -> None:
    """Make the recipe agree with the operator file again: what a crafted folder would do."""
    recipe = json.loads((folder / RECIPE_FILE).read_text())
    file = folder / OPERATORS_FILE
    recipe["operator_files"] = [{"name": OPERATORS_FILE, "sha256": sha256(file), "bytes": file.stat().st_size}]
    (folder / RECIPE_FILE).write_text(json.dumps(recipe))


def mutate(data: bytes, draw, protect: int = 0) -> bytes:
    """Truncated, bits flipped or a span replaced (bytes before ``protect`` left alone by flips)."""
    how = draw(st.sampled_from(["truncate", "flip", "splice"]))
    if how == "truncate":
        return data[:draw(st.integers(0, len(data) - 1))]
    out = bytearray(data)
    if how == "flip":
        for _ in range(draw(st.integers(1, 6))):
            out[draw(st.integers(protect, len(out) - 1))] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    start = draw(st.integers(0, len(out)))
    return bytes(out[:start]) + draw(st.binary(max_size=12)) + bytes(out[start + draw(st.integers(0, 12)):])


def set_at(data, path: list, value):
    where = data
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value


def json_paths(value, prefix=()) -> list[tuple]:
    """Every path into a JSON value (dict keys and list indices), containers included."""
    paths = [prefix] if prefix else []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        paths += json_paths(inner, (*prefix, key))
    return paths


@examples("folder_recipe_mutated")
@given(st.data())
def test_a_mutated_recipe_loads_with_its_operators_or_is_refused(saved_folder, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_of(saved_folder, tmp)
        file = folder / RECIPE_FILE
        if data.draw(st.booleans()):
            file.write_bytes(mutate(file.read_bytes(), data.draw))
        else:
            recipe = json.loads(file.read_text())
            path = data.draw(st.sampled_from(json_paths(recipe)))
            set_at(recipe, list(path), data.draw(JSON))
            file.write_text(json.dumps(recipe))
        check(loaded_or_refused(folder), operators=None)


def safetensors_parts(file: Path) -> tuple[dict, bytes]:
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_safetensors(file: Path, header: dict, body: bytes) -> None:
    text = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text + body)


@examples("folder_operators_crafted")
@given(st.data())
@example(None)
def test_a_crafted_operator_file_with_a_matching_checksum_is_refused_or_loads(saved_folder, data):
    """The recipe's checksum proves nothing about a crafted folder: the file itself is checked."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_of(saved_folder, tmp)
        file = folder / OPERATORS_FILE
        header, body = safetensors_parts(file)
        if data is None:  # the header claims a tensor far past the file's end
            header["op0.weight"]["data_offsets"] = [0, 2**62]
            write_safetensors(file, header, body)
        elif data.draw(st.booleans()):
            file.write_bytes(mutate(file.read_bytes(), data.draw))
        else:  # a field of the header or of an operator entry in its metadata
            entries = json.loads(header["__metadata__"]["ghosted_operators"])
            target = data.draw(st.sampled_from(["header", "entries"]))
            value = header if target == "header" else entries
            set_at(value, list(data.draw(st.sampled_from(json_paths(value)))), data.draw(JSON))
            if target == "entries":
                header["__metadata__"]["ghosted_operators"] = json.dumps(entries)
            write_safetensors(file, header, body)
        relist(folder)
        check(loaded_or_refused(folder), operators=None)


@examples("folder_weights_mutated")
@given(st.data())
def test_mutated_weights_load_or_are_refused(saved_folder, data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_of(saved_folder, tmp)
        file = folder / "model.safetensors"
        raw = file.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        end = data.draw(st.sampled_from([8 + n, len(raw)]))  # the header only, or anywhere
        file.write_bytes(mutate(raw[:end], data.draw) + raw[end:])
        check(loaded_or_refused(folder), operators=1)


OUTSIDE = ["../outside.bin", "/etc/hostname", "sub/../../outside.bin", "..", "", "./", "link.bin", "fifo.bin",
           "folder.bin", "ok/../" + OPERATORS_FILE]


@examples("folder_paths")
@given(st.sampled_from(OUTSIDE), st.sampled_from(["sha", "nosha", "badsize"]))
@example("../outside.bin", "sha")
@example("link.bin", "sha")
@example("fifo.bin", "sha")
def test_a_recipe_naming_files_outside_or_not_regular_is_refused(saved_folder, name, checksum):
    with tempfile.TemporaryDirectory() as tmp:
        folder = copy_of(saved_folder, tmp)
        outside = Path(tmp) / "outside.bin"
        outside.write_bytes((folder / OPERATORS_FILE).read_bytes())
        os.symlink(outside, folder / "link.bin")
        os.mkfifo(folder / "fifo.bin")
        (folder / "folder.bin").mkdir()
        recipe = json.loads((folder / RECIPE_FILE).read_text())
        entry = {"name": name, "sha256": sha256(outside), "bytes": outside.stat().st_size}
        if checksum == "nosha":
            del entry["sha256"]
        elif checksum == "badsize":
            entry["bytes"] = str(entry["bytes"])
        recipe["operator_files"].append(entry)
        (folder / RECIPE_FILE).write_text(json.dumps(recipe))
        out = loaded_or_refused(folder)
    assert isinstance(out, BaseException), f"{name!r} ({checksum}) was accepted"
    assert_refusal(out, REFUSALS)
