"""Files Ghosted did not write: JSON files read within a bound, regular files only, names confined to their
folder, and weight headers (safetensors, GGUF) checked against the file's real size before anything is
allocated. Crafted and truncated headers answer with one ValueError naming the file, for any mutation."""

from __future__ import annotations

import json
import os
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ghosted.core.untrusted import (MAX_JSON_BYTES, check_gguf_header, check_safetensors_header, confined_file,
                                    read_json_file, read_small_file)
from tests.properties import assert_refusal, bounded_memory, examples


# ------------------------------------------------------------------------------------ small files
def test_a_device_a_fifo_and_a_folder_are_refused_before_reading(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for path in ("/dev/zero", tmp_path / "fifo", tmp_path):
        with pytest.raises(ValueError, match="not a regular file|is a folder"):
            read_small_file(path, "recipe")
    with pytest.raises(FileNotFoundError, match="No recipe at"):
        read_small_file(tmp_path / "missing.json", "recipe")


def test_a_file_beyond_the_bound_is_refused_by_its_size(tmp_path):
    huge = tmp_path / "huge.json"
    with huge.open("wb") as handle:  # sparse: the size is claimed, no disk is used
        handle.truncate(MAX_JSON_BYTES + 1)
    with pytest.raises(ValueError, match="at most .* are read"):
        read_json_file(huge, "recipe")


def test_json_that_is_not_json_names_the_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff{")
    with pytest.raises(ValueError, match="bad.json is not valid JSON"):
        read_json_file(bad, "recipe")
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000)
    with pytest.raises(ValueError, match="not valid JSON"):
        read_json_file(deep, "recipe")


@pytest.mark.parametrize("name", ["../x", "/etc/hostname", "a/../../x", "", "..", "link", None, 3])
def test_names_leaving_the_folder_are_refused(tmp_path, name):
    folder = tmp_path / "folder"
    folder.mkdir()
    (tmp_path / "x").write_text("outside")
    os.symlink(tmp_path / "x", folder / "link")
    with pytest.raises(ValueError, match="outside|not a file name|is a folder"):
        confined_file(folder, name)


def test_a_name_inside_the_folder_is_its_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"1")
    os.symlink("sub/a.bin", tmp_path / "inner-link")
    assert confined_file(tmp_path, "sub/a.bin") == tmp_path / "sub" / "a.bin"
    assert confined_file(tmp_path, "inner-link") == tmp_path / "inner-link"  # a link staying inside is fine
    with pytest.raises(FileNotFoundError):
        confined_file(tmp_path, "missing.bin")


# ------------------------------------------------------------------------------------ safetensors
def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]] | None = None) -> bytes:
    """A valid .safetensors file of zeros: name -> (dtype, shape)."""
    sizes = {"F32": 4, "F16": 2, "I64": 8}
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, (dtype, shape) in (tensors or {"a": ("F32", [2, 3]), "b": ("F16", [4])}).items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * offset


def test_a_valid_safetensors_header_is_returned(tmp_path):
    file = tmp_path / "w.safetensors"
    file.write_bytes(safetensors_bytes())
    assert check_safetensors_header(file)["a"]["shape"] == [2, 3]


@pytest.mark.parametrize("content, words", [
    (struct.pack("<Q", 2**62) + b"{}", "header claims"),
    (b"\x01\x02", "shorter than the 8-byte"),
    (safetensors_bytes()[:-3], "truncated download"),
    (safetensors_bytes().replace(b"[2, 3]", b"[2, 9]"), "spans"),  # a shape larger than its bytes
    (struct.pack("<Q", 4) + b"[1] ", "not a JSON object"),
])
def test_crafted_or_truncated_safetensors_are_one_clear_error(tmp_path, content, words):
    file = tmp_path / "w.safetensors"
    file.write_bytes(content)
    with pytest.raises(ValueError, match=f"w.safetensors is damaged.*{words}"):
        check_safetensors_header(file)


# ------------------------------------------------------------------------------------ GGUF
def gguf_bytes(n_tokens: int = 5) -> bytes:
    """A small valid GGUF (version 3): a string, a number, a string array and two F32 tensors."""
    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text.encode())) + text.encode()

    kv = [string("general.architecture") + struct.pack("<I", 8) + string("llama"),
          string("llama.block_count") + struct.pack("<II", 4, 2),
          string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, n_tokens)
          + b"".join(string(f"t{i}") for i in range(n_tokens))]
    tensors = [("w0", [4, 2]), ("w1", [8])]
    infos, offset = b"", 0
    for name, dims in tensors:
        infos += string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", 0, offset)  # type 0: F32
        offset += 4 * dims[0] * (dims[1] if len(dims) > 1 else 1)
        offset = -(-offset // 32) * 32
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + infos
    return head + b"\0" * (-len(head) % 32) + b"\0" * offset


def test_a_valid_gguf_header_passes(tmp_path):
    file = tmp_path / "m.gguf"
    file.write_bytes(gguf_bytes())
    check_gguf_header(file)


def test_the_bundled_gguf_passes():
    from ghosted.models.assets import bundled_gguf_path

    check_gguf_header(bundled_gguf_path())


@pytest.mark.parametrize("patch, words", [
    (lambda b: b[:-5], "truncated download"),
    (lambda b: b[:200], "past the end"),
    (lambda b: b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40) + b[24:], "more than"),
    (lambda b: b"GGML" + b[4:], "magic"),
    (lambda b: b[:24] + struct.pack("<Q", 2**63) + b[32:], "past the end"),
])
def test_crafted_or_truncated_gguf_are_one_clear_error(tmp_path, patch, words):
    file = tmp_path / "m.gguf"
    file.write_bytes(patch(gguf_bytes()))
    with pytest.raises(ValueError, match=f"m.gguf is damaged.*{words}"):
        check_gguf_header(file)


@examples("headers_mutated")
@given(st.sampled_from(["safetensors", "gguf"]), st.data())
def test_any_mutated_header_is_accepted_or_one_clear_error(tmp_path, kind, data):
    """For any truncation, bit flip or spliced bytes: the check passes or raises a ValueError naming the file,
    within the memory bound; it never allocates what a header claims."""
    raw = safetensors_bytes() if kind == "safetensors" else gguf_bytes()
    how = data.draw(st.sampled_from(["truncate", "flip", "splice"]))
    out = bytearray(raw)
    if how == "truncate":
        out = out[:data.draw(st.integers(0, len(out) - 1))]
    elif how == "flip":
        for _ in range(data.draw(st.integers(1, 6))):
            out[data.draw(st.integers(0, min(len(out), 400) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    else:
        start = data.draw(st.integers(0, min(len(out), 400)))
        out[start:start + 8] = data.draw(st.binary(min_size=8, max_size=8))
    file = tmp_path / f"m.{kind}"
    file.write_bytes(bytes(out))
    check = check_safetensors_header if kind == "safetensors" else check_gguf_header
    with bounded_memory():
        try:
            check(file)
        except ValueError as err:
            assert_refusal(err, (ValueError,))
            assert str(file) in str(err)


# ------------------------------------------------------------------------------------ through the front ends
def test_a_crafted_gguf_is_one_line_and_exit_2_on_the_command_line(tmp_path, capsys):
    from ghosted.cli import main

    file = tmp_path / "crafted.gguf"
    file.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40) + gguf_bytes()[24:])  # once a struct.error
    assert main(["run", "--model", str(file), "--drop", "1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "crafted.gguf is damaged" in err and "Traceback" not in err


def test_a_truncated_weights_file_is_refused_before_loading(tmp_path):
    from ghosted.models.loading import load_model
    from tests.tiny import tiny_model

    folder = tmp_path / "model"
    tiny_model("llama").save_pretrained(folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # an interrupted download
    with bounded_memory(), pytest.raises(ValueError, match="model.safetensors is damaged.*truncated"):
        load_model(str(folder), device="cpu")
