"""Files Ghosted did not write: read within bounds, confined to their folder, checked against their size.

A recipe from a colleague, a downloaded checkpoint or a folder on a shared server may be damaged,
truncated or crafted. Everything here answers with one ``ValueError`` (``FileNotFoundError`` for a
missing file) whose message names the file, and never reads, hashes or allocates more than the
file's real size allows:

- ``read_small_file``: a JSON recipe or results file, a regular file of bounded size (a device file
  or a FIFO would be read forever);
- ``confined_file``: a file a folder's manifest names, which must stay inside that folder (no
  absolute path, no ``..``, no symbolic link leading out) and be a regular file;
- ``check_safetensors_header`` and ``check_gguf_header``: a weights file's header, every length and
  offset in it checked against the file's real size before a loader trusts it.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import stat
import struct
from pathlib import Path, PurePath

MAX_JSON_BYTES = 64 * 2**20  # a recipe or results JSON; real ones are kilobytes, a grid's a few MB
MAX_SAFETENSORS_HEADER = 100_000_000  # the safetensors format's own limit on its JSON header
SAFETENSORS_ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2,
                          "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8,
                          "F64": 8, "C64": 8}  # bytes per element; a dtype not listed is bounds-checked only


def regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` when it is a regular file (symbolic links followed); FileNotFoundError when missing,
    ValueError for a folder, a device, a FIFO or a socket (reading those never ends or means nothing)."""
    file = Path(path)
    try:
        mode = file.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"No {what} at {file}.") from None
    except OSError as err:
        raise ValueError(f"The {what} {file} cannot be read ({err.strerror or err}).") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"The {what} {file} is a folder, not a file.")
    if not stat.S_ISREG(mode):
        raise ValueError(f"The {what} {file} is not a regular file (a device, a pipe or a socket): refused, "
                         "since reading it would never end.")
    return file


def read_small_file(path: str | os.PathLike, what: str = "file", limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, its size checked before it is read."""
    file = regular_file(path, what)
    size = file.stat().st_size
    if size > limit:
        raise ValueError(f"The {what} {file} is {size:,} bytes; at most {limit:,} are read. It is not a "
                         f"{what} Ghosted wrote, or it was damaged.")
    with file.open("rb") as handle:
        data = handle.read(limit + 1)  # a file growing while it is read stops at the limit too
    if len(data) > limit:
        raise ValueError(f"The {what} {file} grew beyond {limit:,} bytes while it was read.")
    return data


def read_json_file(path: str | os.PathLike, what: str = "file", limit: int = MAX_JSON_BYTES):
    """The JSON value of a small regular file; a ValueError naming it when it is not UTF-8 JSON."""
    data = read_small_file(path, what, limit)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise ValueError(f"The {what} {path} is not valid JSON ({type(err).__name__}: {err}).") from None


def confined_file(folder: str | os.PathLike, name, what: str = "file") -> Path:
    """The file ``name`` (as a folder's manifest lists it) inside ``folder``, or a ValueError.

    Refused: a name that is not a non-empty string, an absolute path, a ``..`` part, a path whose
    resolved location (symbolic links followed) is outside ``folder``, and anything but a regular file.
    A missing file is a FileNotFoundError (the caller says what it means).
    """
    base = Path(folder)
    if not isinstance(name, str) or not name.strip() or "\x00" in name:
        raise ValueError(f"The {what} name {name!r} listed in {base} is not a file name.")
    parts = PurePath(name.replace("\\", "/"))
    if parts.is_absolute() or os.path.isabs(name) or ".." in parts.parts:
        raise ValueError(f"The {what} {name!r} listed in {base} points outside its folder (an absolute path "
                         "or '..'): refused. A saved folder only ever names files inside itself.")
    file = base / name
    inside = base.resolve()
    if not file.exists() and not file.is_symlink():
        raise FileNotFoundError(f"{file} is missing.")
    if file.resolve() != inside and inside not in file.resolve().parents:
        raise ValueError(f"The {what} {file} is a link to {file.resolve()}, outside {inside}: refused. A saved "
                         "folder only ever names files inside itself.")
    return regular_file(file, what)


# ------------------------------------------------------------------------------------ safetensors
def check_safetensors_header(path: str | os.PathLike) -> dict:
    """The header (tensor name -> dtype, shape, offsets) of a ``.safetensors`` file, once every
    length and offset in it fits the file's real size; a ValueError naming the file otherwise."""
    file = regular_file(path, "weights file")
    size = file.stat().st_size
    with file.open("rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise _broken(file, f"it is {size} bytes long, shorter than the 8-byte header length")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(size - 8, MAX_SAFETENSORS_HEADER):
            raise _broken(file, f"its header claims {header_len:,} bytes but the file holds {size - 8:,} after "
                                "the length")
        raw = handle.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise _broken(file, f"its header is not JSON ({type(err).__name__})") from None
    if not isinstance(header, dict):
        raise _broken(file, "its header is not a JSON object")
    data_bytes = size - 8 - header_len
    for name, entry in header.items():
        if name != "__metadata__":
            _check_tensor_entry(file, name, entry, data_bytes)
    return header


def _check_tensor_entry(file: Path, name: str, entry, data_bytes: int) -> None:
    if not isinstance(entry, dict):
        raise _broken(file, f"tensor {name!r} has no description")
    offsets, shape, dtype = entry.get("data_offsets"), entry.get("shape"), entry.get("dtype")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_whole(x) and x >= 0 for x in offsets)
            and offsets[0] <= offsets[1]):
        raise _broken(file, f"tensor {name!r} has no valid data_offsets")
    if not (isinstance(shape, list) and all(_whole(x) and x >= 0 for x in shape)) or not isinstance(dtype, str):
        raise _broken(file, f"tensor {name!r} has no valid shape or dtype")
    if offsets[1] > data_bytes:
        raise _broken(file, f"tensor {name!r} ends at byte {offsets[1]:,} of the data, which holds "
                            f"{data_bytes:,} bytes (a truncated download?)")
    item = SAFETENSORS_ITEM_BYTES.get(dtype)
    if item is not None and math.prod(shape) * item != offsets[1] - offsets[0]:
        raise _broken(file, f"tensor {name!r} is {dtype} {shape} but spans {offsets[1] - offsets[0]:,} bytes")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _broken(file: Path, why: str) -> ValueError:
    return ValueError(f"{file} is damaged or not a weights file: {why}. If it is a download or a copy, it is "
                      "probably truncated: download, copy or export it again.")


# ------------------------------------------------------------------------------------ GGUF
_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUFValueType
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _Cursor:
    """Reads little-endian values from a mapped file, refusing to step past its end."""

    def __init__(self, data, file: Path):
        self.data, self.file, self.pos = data, file, 0

    def take(self, n: int) -> int:
        """Skip ``n`` bytes (checked against what is left); return where they start."""
        if n < 0 or n > len(self.data) - self.pos:
            raise _broken(self.file, f"its header claims {n:,} bytes at offset {self.pos:,}, past the end of the "
                                     f"{len(self.data):,}-byte file")
        start, self.pos = self.pos, self.pos + n
        return start

    def unpack(self, fmt: str):
        return struct.unpack_from(fmt, self.data, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> bytes:
        length = self.unpack("<Q")
        start = self.take(length)
        return bytes(self.data[start:start + min(length, 256)])  # only short strings (keys) are looked at

    def skip_strings(self, count: int) -> None:
        """Skip ``count`` strings (a vocabulary: the one loop that must be fast)."""
        data, pos, end = self.data, self.pos, len(self.data)
        for _ in range(count):
            length = int.from_bytes(data[pos:pos + 8], "little") if pos + 8 <= end else end
            pos += 8 + length
            if pos > end:
                raise _broken(self.file, f"a string claims {length:,} bytes, past the end of the file")
        self.pos = pos

    def value(self, kind: int, depth: int = 0) -> None:
        if kind in _GGUF_SCALAR_BYTES:
            self.take(_GGUF_SCALAR_BYTES[kind])
        elif kind == _GGUF_STRING:
            self.string()
        elif kind == _GGUF_ARRAY and depth < 4:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if item in _GGUF_SCALAR_BYTES:
                self.take(count * _GGUF_SCALAR_BYTES[item])
                return
            if count * 8 > len(self.data) - self.pos:  # every string or array item takes 8 bytes at least
                raise _broken(self.file, f"an array claims {count:,} items, more than the file can hold")
            if item == _GGUF_STRING:
                self.skip_strings(count)
                return
            for _ in range(count):
                self.value(item, depth + 1)
        else:
            raise _broken(self.file, f"unknown value type {kind} at offset {self.pos:,}")


def check_gguf_header(path: str | os.PathLike) -> None:
    """Walk a ``.gguf`` file's header (metadata and tensor table) and check every tensor's data lies within
    the file, before a loader allocates anything from it; a ValueError naming the file otherwise."""
    file = regular_file(path, "GGUF file")
    if file.stat().st_size < 24:
        raise _broken(file, "it is shorter than a GGUF header")
    with file.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data, file)
        if bytes(data[:4]) != b"GGUF":
            raise _broken(file, "it does not start with the GGUF magic bytes")
        cursor.take(4)
        version = cursor.unpack("<I")
        if version not in (2, 3):
            raise _broken(file, f"GGUF version {version} is not one this reader knows (2 or 3)")
        n_tensors, n_kv = cursor.unpack("<Q"), cursor.unpack("<Q")
        if n_kv * 13 + n_tensors * 24 > len(data):  # a key-value pair takes 13 bytes at least, a tensor 24
            raise _broken(file, f"its header claims {n_tensors:,} tensors and {n_kv:,} metadata entries, "
                                f"more than {len(data):,} bytes can hold")
        alignment = 32
        for _ in range(n_kv):
            key = cursor.string()
            kind = cursor.unpack("<I")
            if key == b"general.alignment" and kind == 4:
                alignment = max(1, cursor.unpack("<I"))
            else:
                cursor.value(kind)
        tensors = [_tensor_info(cursor) for _ in range(n_tensors)]
        data_start = -(-cursor.pos // alignment) * alignment
        for name, offset, nbytes in tensors:
            if data_start + offset + nbytes > len(data):
                raise _broken(file, f"tensor {name!r} ends at byte {data_start + offset + nbytes:,}, past the end "
                                    f"of the {len(data):,}-byte file (a truncated download?)")


def _tensor_info(cursor: _Cursor) -> tuple[str, int, int]:
    """(name, data offset, bytes) of one tensor of a GGUF tensor table."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    name = cursor.string().decode("utf-8", "replace")
    n_dims = cursor.unpack("<I")
    if n_dims > 8:
        raise _broken(cursor.file, f"tensor {name!r} claims {n_dims} dimensions")
    dims = [cursor.unpack("<Q") for _ in range(n_dims)]
    kind, offset = cursor.unpack("<I"), cursor.unpack("<Q")
    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise _broken(cursor.file, f"tensor {name!r} has unknown type {kind}") from None
    return name, offset, math.prod(dims) // block * block_bytes
