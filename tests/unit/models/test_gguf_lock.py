"""Converting a GGUF into the cache: once, under a lock, whole or not at all; a broken file is named.

The conversion itself is replaced by a small fake (``convert=``) so that the locking and staging are
tested in milliseconds; the broken-file tests use real bytes of the bundled GGUF.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ghosted.models.assets import file_lock, file_sha256
from ghosted.models.loading import _gguf_to_safetensors, load_model


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("GHOSTED_CACHE", str(folder))
    return folder


@pytest.fixture
def gguf(tmp_path, monkeypatch) -> Path:
    """Any bytes will do for the fake conversion: the cache key is their sha256 (the header check, tested
    on real bytes below and in tests/unit/core/test_untrusted.py, is set aside for these bytes)."""
    monkeypatch.setattr("ghosted.models.loading.check_gguf_header", lambda path: None)
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF fake model " * 64)
    return path


def write_fake(gguf: Path, folder: Path) -> None:
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "config.json").write_text("{}")


def cache_entries(cache: Path) -> list[str]:
    """Everything in the converted-models folder but the lock files (kept on purpose)."""
    models = cache / "models"
    return sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) if models.exists() else []


# ------------------------------------------------------------------------------- two processes
def _convert_in_child(gguf: str, log: str, barrier, results) -> None:
    def slow_fake(source: Path, folder: Path) -> None:
        marker = Path(log).with_suffix(".busy")
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL)  # fails if the other one converts right now
            os.close(fd)
        except FileExistsError:
            Path(log).with_suffix(".overlap").touch()
        time.sleep(0.5)  # a window for the other process to collide (no assertion on time)
        write_fake(source, folder)
        marker.unlink(missing_ok=True)
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")

    barrier.wait()
    results.put(str(_gguf_to_safetensors(Path(gguf), convert=slow_fake)))


def test_two_processes_converting_at_once_convert_once(gguf, cache, tmp_path):
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2), context.Queue()
    log = tmp_path / "conversions.log"
    children = [context.Process(target=_convert_in_child, args=(str(gguf), str(log), barrier, results))
                for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    assert [child.exitcode for child in children] == [0, 0]
    folders = {results.get(timeout=5), results.get(timeout=5)}
    expected = cache / "models" / file_sha256(gguf)[:16]
    assert folders == {str(expected)}  # the second one waited and reused the first one's folder
    assert len(log.read_text().splitlines()) == 1 and not log.with_suffix(".overlap").exists()
    assert cache_entries(cache) == [expected.name] and (expected / "config.json").exists()


def test_the_lock_makes_a_second_holder_wait(tmp_path):
    """Two opens of the lock file (as two processes do) never hold it together."""
    import threading

    lock, events = tmp_path / "x.lock", []
    first_holds, release = threading.Event(), threading.Event()

    def first():
        with file_lock(lock):
            events.append("first in")
            first_holds.set()
            release.wait(30)
            events.append("first out")

    def second():
        first_holds.wait(30)
        with file_lock(lock):
            events.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_holds.wait(30)
    time.sleep(0.2)  # give the second thread every chance to (wrongly) get in
    release.set()
    for thread in threads:
        thread.join(30)
    assert events == ["first in", "first out", "second in"]


# ------------------------------------------------------------------------------ interruptions
@pytest.mark.parametrize("fault", [KeyboardInterrupt(), RuntimeError("out of memory")])
def test_an_interrupted_conversion_leaves_nothing(gguf, cache, fault):
    def half_then_fail(source: Path, folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"half")
        raise fault

    with pytest.raises(type(fault)):
        _gguf_to_safetensors(gguf, convert=half_then_fail)
    assert cache_entries(cache) == []  # no temporary folder, no half-converted model
    target = _gguf_to_safetensors(gguf, convert=write_fake)  # the lock was released
    assert cache_entries(cache) == [target.name]


def test_leftovers_of_a_killed_conversion_are_removed(gguf, cache):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    key = file_sha256(gguf)[:16]
    models = cache / "models"
    for name in (f".{key}.tmp-{dead}", f"{key}.tmp{dead}", f"{key}"):  # staged, older naming, incomplete
        (models / name).mkdir(parents=True)
        (models / name / "model.safetensors").write_bytes(b"half")
    (models / "other.txt").write_text("not ours")
    target = _gguf_to_safetensors(gguf, convert=write_fake)
    assert cache_entries(cache) == [key, "other.txt"]
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert (target / "model.safetensors").read_bytes() == b"weights"


def test_a_finished_conversion_is_reused(gguf, cache):
    calls = []
    first = _gguf_to_safetensors(gguf, convert=lambda s, f: (calls.append(1), write_fake(s, f)))
    second = _gguf_to_safetensors(gguf, convert=lambda s, f: calls.append(2))
    assert first == second and calls == [1]


# ---------------------------------------------------------------------------------- broken files
def bundled_bytes(n: int) -> bytes:
    from ghosted.models.assets import bundled_gguf_path

    try:
        path = bundled_gguf_path()
    except FileNotFoundError:
        pytest.skip("the bundled model is not installed")
    with open(path, "rb") as handle:
        return handle.read(n)


@pytest.mark.parametrize("content", [
    pytest.param(lambda: bundled_bytes(200), id="cut-in-the-header"),  # was struct.error
    pytest.param(lambda: bundled_bytes(4_000_000), id="cut-in-the-tensors", marks=pytest.mark.slow),  # 4 MB read
    pytest.param(lambda: b"GGUF", id="magic-only"),
    pytest.param(lambda: b"<html>404 Not Found</html>", id="not-gguf"),
])
def test_a_broken_gguf_is_a_value_error_naming_the_file(tmp_path, cache, content):
    path = tmp_path / "downloaded.gguf"
    path.write_bytes(content())
    named = r"downloaded\.gguf is damaged or not a weights file: .*download, copy or export it again"
    with pytest.raises(ValueError, match=named):
        load_model(str(path), device="cpu")
    assert cache_entries(cache) == []
    assert path.read_bytes() == content()  # the file is only read
