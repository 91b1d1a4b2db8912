"""Save a recovered model as a standard Hugging Face folder, and load it back exactly.

A recovered model is a pruned view whose recovery operators are child modules named ``ghosted_*``
applied by forward hooks (see ``ghosted.operators.sites``). Saving splits it in three:

  * the kept weights, renumbered, in safetensors with the updated config (``num_hidden_layers``,
    ``layer_types``) and the tokenizer: a plain ``from_pretrained`` loads this with no missing or
    unexpected keys. When the method folded into existing weights (ReplaceMe least squares into
    ``down_proj``) this *is* the recovered model;
  * ``ghosted_operators.safetensors``: every operator with its site (pruned layer, before/after/MLP
    branch, order at that site, the gap it bridges, the method), only when there are operators;
  * ``ghosted_recipe.json``: how the model was made (base model and revision, dropped layers,
    calibration protocol, method and settings, versions), human-readable, and every operator
    file with its sha256 and size. It is written last.

No model folder is ever overwritten by accident: a non-empty target needs ``overwrite=True``, the
folder the model came from and Ghosted's cache are refused (``ghosted.operators.targets``), and the
folder is written to a temporary sibling that is renamed into place only when complete.

``load_recovered`` checks the operator files against the recipe, loads the plain folder and
re-attaches the operators, so the logits are identical to those of the model that was saved.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from ghosted.core.untrusted import check_safetensors_header, confined_file
from ghosted.models.architecture import layers_of, spec_for
from ghosted.models.assets import file_sha256, staged_folder
from ghosted.operators.modules import SAVED_KINDS
from ghosted.operators.sites import (BranchOperator, PatchSite, RobustStreamOperator, StreamOperator,
                                     attach_branch_operator, attach_stream_operators, operators_of)
from ghosted.models.pruning import format_layers, original_indices
from ghosted.models.loading import OPERATORS_FILE, RECIPE_FILE, check_saved_folder, check_weight_headers
from ghosted.operators.saved_files import ghosted_files, keep_user_files
from ghosted.operators.targets import check_target_folder, protected_folders  # noqa: F401 (re-exported)

RECIPE_FORMAT = 2  # bumped when a field changes meaning (2: operator_files with sha256)
_SITE_NAMES = {"ghosted_pre": "before", "ghosted_post": "after", "ghosted_branch": "mlp"}
_KINDS = {StreamOperator: "stream", BranchOperator: "branch", RobustStreamOperator: "robust"}


# --------------------------------------------------------------------------------------- saving
def save_recovered(model: nn.Module, path: str | Path, tokenizer=None, recipe=None,
                   overwrite: bool = False, spec=None, **save_options) -> Path:
    """Write ``model`` (a recovered or plain pruned model) to the folder ``path``; return it.

    The folder is written to a temporary sibling and renamed into place only when complete, with
    the recipe (which lists every operator file with its sha256) written last: an interrupted save
    leaves the previous folder, if any, as it was.

    Args:
        model: e.g. ``recover(...).results["ghost"].model``; it is read, never changed.
        path: output folder, created if needed. A non-empty folder is refused unless ``overwrite``;
            the folder the model was loaded from and Ghosted's cache are refused always.
        tokenizer: its tokenizer, or the ``LoadedModel`` the model was pruned from (then the base
            model's source and revision are recorded too).
        recipe: the ``RecoveryRun`` that produced ``model`` (its settings, dropped layers and
            calibration protocol go into the recipe), or a dict of extra recipe fields, or None.
        spec: the experiment spec that made it (an ``ExperimentSpec`` or its ``to_dict()``), kept under
            "spec" so that ``python -m ghosted run --recipe`` can rerun it.
        overwrite: replace the model saved in ``path``: its files go once the new folder is in place;
            every other file in it (the user's) is kept in the new folder.
        save_options: passed to ``save_pretrained``, e.g. ``max_shard_size="5GB"`` (an offloaded
            model is gathered shard by shard in CPU memory).

    Example:
        >>> run = recover(lm.model, "20-26", ["ghost"], calib)
        >>> save_recovered(run.results["ghost"].model, "smollm2-ghost", lm, recipe=run)
        >>> load_recovered("smollm2-ghost").model       # the same logits
    """
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    loaded = tokenizer if tok is not tokenizer else None
    out = check_target_folder(path, overwrite, protected_folders(loaded, model))
    entries, tensors = _operator_entries(model)
    state = {k: v for k, v in model.state_dict().items() if not _is_ghosted_key(k)}
    full = build_recipe(model, entries, recipe, loaded=loaded)
    spec = spec if spec is not None else getattr(recipe, "spec", None)  # a session's fit carries its spec
    if spec is not None:
        full["spec"] = spec.to_dict() if hasattr(spec, "to_dict") else dict(spec)  # an ExperimentSpec, or its dict
    else:  # what `run --recipe` will say it lacks
        full["no_spec"] = "windows" if hasattr(recipe, "results") else "no-run"  # spec_files.NO_SPEC says why
    previous = ghosted_files(out) if overwrite and out.is_dir() else None
    with staged_folder(out) as staged:
        try:
            model.save_pretrained(staged, state_dict=state, **save_options)
            if tok is not None:
                tok.save_pretrained(staged)
            if tensors:
                save_file(tensors, str(staged / OPERATORS_FILE),
                          metadata={"ghosted_operators": json.dumps(entries), "format": "pt"})
            full["operator_files"] = [_file_entry(staged / OPERATORS_FILE)] if tensors else []
            full["files"] = sorted([p.name for p in staged.iterdir()] + [RECIPE_FILE])  # what Ghosted wrote
            if previous is not None:
                keep_user_files(out, staged, previous)
            (staged / RECIPE_FILE).write_text(json.dumps(full, indent=2, default=str) + "\n")  # last
        except (OSError, SafetensorError) as err:  # a full disk, a read-only folder: the old folder stays
            where = "is left as it was" if out.exists() else "was not created"
            raise OSError(f"Could not save the model to {out} ({' '.join(str(err).split())}); {out} {where}. "
                          "Free some space or choose another folder.") from err
    return out


def _file_entry(file: Path) -> dict:
    return {"name": file.name, "sha256": file_sha256(file), "bytes": file.stat().st_size}


def _is_ghosted_key(key: str) -> bool:
    return any(part.startswith("ghosted_") for part in key.split("."))


def _operator_entries(model: nn.Module) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """One JSON-ready entry per operator (its site) and the tensors to store, keyed alike."""
    entries, tensors, order = [], {}, {}
    kept = original_indices(model)
    for layer, site_name, op in operators_of(model):
        kind = _kind_of(op)
        key = f"op{len(entries)}"
        site = (layer, site_name)
        order[site] = order.get(site, -1) + 1
        entry = {"key": key, "kind": kind, "layer": layer, "original_layer": kept[layer],
                 "position": _SITE_NAMES[site_name], "order": order[site],
                 "boundary": list(op.boundary), "method": op.method}
        if kind in SAVED_KINDS:  # low-rank and trained operators describe themselves
            entry.update(op.saved_entry())
            tensors.update({f"{key}.{name}": t for name, t in op.saved_tensors().items()})
            entries.append(entry)
            continue
        entry["dim"] = int(op.weight.shape[0])
        tensors[f"{key}.weight"] = op.weight.detach().float().cpu().contiguous()  # (d, d)
        if kind == "robust":
            entry["sink_rule"] = asdict(op.context.rule)
            tensors[f"{key}.sink_constant"] = op.sink_constant.detach().float().cpu().contiguous()  # (d,)
            if op.sink_linear is not None:
                tensors[f"{key}.sink_linear"] = op.sink_linear.detach().float().cpu().contiguous()  # (d, d)
        entries.append(entry)
    return entries, tensors


def _kind_of(op: nn.Module) -> str:
    if type(op) in _KINDS:
        return _KINDS[type(op)]
    if SAVED_KINDS.get(getattr(op, "kind", None)) is type(op):
        return op.kind
    raise ValueError(f"Cannot save a {type(op).__name__} operator: ghosted saves StreamOperator, "
                     "BranchOperator, RobustStreamOperator, LowRankOperator and FFNOperator.")


# --------------------------------------------------------------------------------------- recipe
def build_recipe(model: nn.Module, operators: list[dict], recipe=None, loaded=None) -> dict:
    """The ``ghosted_recipe.json`` content for ``model``: how it was made and how to load it.

    ``recipe`` is a ``RecoveryRun`` (settings, dropped layers and calibration protocol are read
    from it), a dict of fields that override the inferred ones, or None.
    """
    from ghosted.models.loading import versions

    extra = recipe if isinstance(recipe, dict) else {}
    run = None if isinstance(recipe, dict) or recipe is None else recipe
    kept = original_indices(model)
    base_layers = run.base_layers if run is not None else _infer_base_layers(kept, operators)
    dropped = [i for i in range(base_layers) if i not in set(kept)]
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    plain = not operators
    out = {
        "format": "ghosted-recipe", "format_version": RECIPE_FORMAT,
        "base_model": _base_model(model, loaded, base_layers),
        "architecture": spec_for(model).family,
        "dropped_layers": dropped, "dropped_spec": format_layers(dropped), "kept_layers": kept,
        "layers": int(config.num_hidden_layers),
        "method": _method_of(model, operators, run),
        "settings": _settings_of(run),
        "calibration": dict(run.protocol) if run is not None else {},
        "operators": operators,
        "checkpoint": "plain" if plain else "needs-ghosted",
        "load_with": ("transformers.AutoModelForCausalLM.from_pretrained(path)" if plain
                      else "ghosted.load_recovered(path)"),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "statistics_dtype": "float64",
        "versions": versions(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out.update(extra)
    return out


def _infer_base_layers(kept: list[int], operators: list[dict]) -> int:
    """Layer count of the base model when no run says it: the last kept layer or gap end."""
    ends = [entry["boundary"][1] for entry in operators]
    return max([max(kept) + 1, *ends])


def _base_model(model: nn.Module, loaded, base_layers: int) -> dict:
    info = {"name_or_path": getattr(model.config, "_name_or_path", ""), "layers": base_layers}
    if loaded is not None:
        info.update(source=loaded.source, revision=loaded.revision, kind=loaded.kind)
    return info


def _method_of(model: nn.Module, operators: list[dict], run) -> str:
    if run is not None:
        for name, result in run.results.items():
            if result.model is model:
                return name
    methods = sorted({entry["method"] for entry in operators})
    return ",".join(methods) if methods else "none or folded"


def _settings_of(run) -> dict:
    if run is None:
        return {}
    return asdict(run.config) if is_dataclass(run.config) else dict(run.config)


# -------------------------------------------------------------------------------------- loading
def load_any(source: str | None = None, **options):
    """Any model source as a ``LoadedModel``; a folder written by ``save_recovered`` comes back with
    its recovery operators (never silently as the plain pruned weights). ``options`` are those of
    ``ghosted.models.loading.load_model``."""
    from ghosted.models.loading import load_model

    if source is not None and (Path(source).expanduser() / RECIPE_FILE).exists():
        return load_recovered(source, **options)
    return load_model(source, **options) if source is not None else load_model(**options)


def load_recovered(path: str | Path, device: str = "auto", dtype: str = "auto",
                   device_map: str | dict | None = None, **options):
    """Load a folder written by ``save_recovered``: the model with its operators re-attached.

    Returns a ``LoadedModel`` (``.model``, ``.tokenizer``; ``.extra["recipe"]`` holds the recipe).
    ``device``, ``dtype`` and ``device_map`` are those of ``ghosted.models.loading.load_model``; the
    operators stay in float32 and follow the stream to its device. The operator files are checked
    against the recipe first (see ``check_saved_folder``).

    Example:
        >>> lm = load_recovered("smollm2-ghost")
        >>> lm.extra["recipe"]["dropped_spec"]       # "20-26"
    """
    from ghosted.models.loading import load_model

    started = time.perf_counter()
    folder = Path(path).expanduser()
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder} is not a saved model folder (no config.json).")
    recipe = check_saved_folder(folder)  # before the weights: a broken folder fails fast
    check_weight_headers(folder)  # a truncated or crafted weights file: one clear error, nothing allocated
    if any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        lm = load_model(str(folder), device=device, dtype=dtype, device_map=device_map, **options)
    else:  # saved without a tokenizer: the model alone
        lm = _load_without_tokenizer(folder, device, dtype, device_map, **options)
    n_ops = attach_saved_operators(lm.model, folder)
    lm.extra.update(recipe=recipe, operators=n_ops)  # kind stays "folder": a local model folder
    lm.load_seconds = time.perf_counter() - started
    return lm


def _load_without_tokenizer(folder: Path, device: str, dtype: str, device_map, **options):
    from transformers import AutoModelForCausalLM

    from ghosted.models.loading import NO_HUB_KERNELS, LoadedModel, resolve_device, resolve_dtype

    where = resolve_device(device) if device_map is None else "device_map"
    torch_dtype = resolve_dtype(dtype, "cuda" if where == "device_map" and torch.cuda.is_available() else where)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, device_map=device_map, **options,
                                                 **NO_HUB_KERNELS)
    if device_map is None:
        model = model.to(where)
    model.eval()
    model.requires_grad_(False)
    return LoadedModel(model=model, tokenizer=None, source=str(folder), kind="folder", device=where,
                       dtype=str(torch_dtype).replace("torch.", ""), load_seconds=0.0,
                       extra={"location": str(folder)})


def attach_saved_operators(model: nn.Module, folder: str | Path) -> int:
    """Re-attach the operators stored in ``folder`` to ``model`` (freshly loaded, so private).

    Returns how many were attached (0 for a plain checkpoint).
    """
    file = Path(folder) / OPERATORS_FILE
    if not file.exists() and not file.is_symlink():
        return 0
    entries, tensors = _read_operators(confined_file(folder, OPERATORS_FILE, "operator file"))
    try:
        return _place_operators(model, entries, tensors)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError) as err:
        raise ValueError(f"{file} is damaged: its operators do not fit this model ({type(err).__name__}: {err}). "
                         "Copy the folder again, or export the model again.") from None


def _place_operators(model: nn.Module, entries: list[dict], tensors: dict[str, torch.Tensor]) -> int:
    """Rebuild every operator entry and attach it at its site; the count attached."""
    n_layers, width = len(layers_of(model)), _width(model)
    for entry in entries:
        _check_entry(entry, tensors, n_layers, width)
    context = _sink_context(model, entries)
    sites: dict[tuple[int, str], list[tuple[int, nn.Module]]] = {}
    for entry in entries:
        op = _rebuild(entry, tensors, context).to(_layer_device(model, entry["layer"]))
        sites.setdefault((entry["layer"], entry["position"]), []).append((entry["order"], op))
    for (layer, position), ops in sites.items():
        ordered = [op for _, op in sorted(ops, key=lambda pair: pair[0])]
        if position == "mlp":
            attach_branch_operator(model, layer, ordered[0])
        else:
            attach_stream_operators(model, PatchSite(layer, before=position == "before"), ordered)
    return len(entries)


def _width(model: nn.Module) -> int | None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)


def _check_entry(entry: dict, tensors: dict[str, torch.Tensor], n_layers: int, width: int | None) -> None:
    """An operator entry that names a layer of this model, a known site and, for a d x d operator, a
    weight as wide as the residual stream (a ValueError otherwise: the file is damaged or crafted)."""
    layer, position, order = entry["layer"], entry["position"], entry["order"]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (layer, order)) or not 0 <= layer < n_layers:
        raise ValueError(f"operator {entry['key']!r} names layer {layer!r}; this model has {n_layers} layers")
    if position not in _SITE_NAMES.values():
        raise ValueError(f"operator {entry['key']!r} has an unknown position {position!r}")
    weight = tensors.get(f"{entry['key']}.weight")
    if entry["kind"] in _KINDS.values() and (weight is None or tuple(weight.shape) != (width, width)):
        shape = None if weight is None else tuple(weight.shape)
        raise ValueError(f"operator {entry['key']!r} has a weight of shape {shape}; this model's width is {width}")


def _read_operators(file: Path) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """The operator entries and tensors of ``file``; a ValueError naming it when it is damaged (its header
    is checked against its real size before any tensor is read)."""
    check_safetensors_header(file)
    try:
        with safe_open(str(file), framework="pt") as handle:
            entries = json.loads((handle.metadata() or {})["ghosted_operators"])
            tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        for entry in entries:
            if not any(name.startswith(f"{entry['key']}.") for name in tensors):
                raise KeyError(f"{entry['key']}.*")
    except Exception as err:  # SafetensorError, JSON, missing keys: all mean a damaged file
        raise ValueError(f"{file} is damaged ({type(err).__name__}: {err}). Copy the folder again, "
                         "or export the model again.") from None
    return entries, tensors


def _rebuild(entry: dict, tensors: dict[str, torch.Tensor], context) -> nn.Module:
    key, boundary, method = entry["key"], tuple(entry["boundary"]), entry["method"]
    if entry["kind"] in SAVED_KINDS:
        own = {name[len(key) + 1:]: t for name, t in tensors.items() if name.startswith(f"{key}.")}
        return SAVED_KINDS[entry["kind"]].from_saved(entry, own, context)
    weight = tensors[f"{key}.weight"]  # (d, d) float32
    if entry["kind"] == "stream":
        return StreamOperator(weight, boundary, method)
    if entry["kind"] == "branch":
        return BranchOperator(weight, boundary, method)
    if entry["kind"] == "robust":
        from ghosted.operators.sites import RobustStreamOperator
        from ghosted.calibration.sinks import SinkMap

        sink_map = SinkMap(constant=tensors[f"{key}.sink_constant"], linear=tensors.get(f"{key}.sink_linear"))
        return RobustStreamOperator(weight, sink_map, context, boundary, method)
    raise ValueError(f"Unknown operator kind {entry['kind']!r} in {OPERATORS_FILE}; a newer ghosted "
                     "may have written it.")


def _sink_context(model: nn.Module, entries: list[dict]):
    """One shared sink context for robust operators, fed by a pre-hook on the layer stack."""
    rules = [entry["sink_rule"] for entry in entries if "sink_rule" in entry]
    if not rules:
        return None
    from ghosted.models.architecture import stack_of
    from ghosted.calibration.sinks import SinkContext, SinkRule

    context = SinkContext(SinkRule(**rules[0]))
    stack_of(model).register_forward_pre_hook(context.hook, with_kwargs=True)
    return context


def _layer_device(model: nn.Module, index: int) -> torch.device:
    """Where layer ``index`` computes: its first real parameter, or accelerate's execution device."""
    layer = layers_of(model)[index]
    hook_device = getattr(getattr(layer, "_hf_hook", None), "execution_device", None)
    if hook_device is not None:
        return torch.device(hook_device)
    for param in layer.parameters():
        if param.device.type != "meta":
            return param.device
    return torch.device("cpu")
