"""Save a recovered model as a standard Hugging Face folder, and load it back exactly.

A recovered model is a pruned view whose recovery operators are child modules named ``ghosted_*``
applied by forward hooks (see ``ghosted.patch``). Saving splits it in three:

  * the kept weights, renumbered, in safetensors with the updated config (``num_hidden_layers``,
    ``layer_types``) and the tokenizer: a plain ``from_pretrained`` loads this with no missing or
    unexpected keys. When the method folded into existing weights (ReplaceMe least squares into
    ``down_proj``) this *is* the recovered model;
  * ``ghosted_operators.safetensors``: every operator with its site (pruned layer, before/after/MLP
    branch, order at that site, the gap it bridges, the method), only when there are operators;
  * ``ghosted_recipe.json``: how the model was made (base model and revision, dropped layers,
    calibration protocol, method and settings, versions), human-readable.

``load_recovered`` loads the plain folder and re-attaches the operators, so the logits are
identical to those of the model that was saved.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ghosted.arch import layers_of, spec_for
from ghosted.patch import (BranchOperator, PatchSite, StreamOperator, attach_branch_operator,
                           attach_stream_operators, operators_of)
from ghosted.pruning import format_layers, original_indices

OPERATORS_FILE = "ghosted_operators.safetensors"
RECIPE_FILE = "ghosted_recipe.json"
RECIPE_FORMAT = 1  # bumped when a field changes meaning
_SITE_NAMES = {"ghosted_pre": "before", "ghosted_post": "after", "ghosted_branch": "mlp"}
_KINDS = {StreamOperator: "stream", BranchOperator: "branch"}


# --------------------------------------------------------------------------------------- saving
def save_recovered(model: nn.Module, path: str | Path, tokenizer=None, recipe=None,
                   **save_options) -> Path:
    """Write ``model`` (a recovered or plain pruned model) to the folder ``path``; return it.

    Args:
        model: e.g. ``recover(...).results["ghost"].model``; it is read, never changed.
        path: output folder, created if needed; earlier ghosted files in it are replaced.
        tokenizer: its tokenizer, or the ``LoadedModel`` the model was pruned from (then the base
            model's source and revision are recorded too).
        recipe: the ``RecoveryRun`` that produced ``model`` (its settings, dropped layers and
            calibration protocol go into the recipe), or a dict of extra recipe fields, or None.
        save_options: passed to ``save_pretrained``, e.g. ``max_shard_size="5GB"`` (an offloaded
            model is gathered shard by shard in CPU memory).

    Example:
        >>> run = recover(lm.model, "20-26", ["ghost"], calib)
        >>> save_recovered(run.results["ghost"].model, "smollm2-ghost", lm, recipe=run)
        >>> load_recovered("smollm2-ghost").model       # the same logits
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    entries, tensors = _operator_entries(model)
    state = {k: v for k, v in model.state_dict().items() if not _is_ghosted_key(k)}
    model.save_pretrained(out, state_dict=state, **save_options)
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    if tok is not None:
        tok.save_pretrained(out)
    (out / OPERATORS_FILE).unlink(missing_ok=True)  # never leave a stale operator file behind
    if tensors:
        save_file(tensors, str(out / OPERATORS_FILE),
                  metadata={"ghosted_operators": json.dumps(entries), "format": "pt"})
    full = build_recipe(model, entries, recipe, loaded=tokenizer if tok is not tokenizer else None)
    (out / RECIPE_FILE).write_text(json.dumps(full, indent=2, default=str) + "\n")
    return out


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
                 "boundary": list(op.boundary), "method": op.method, "dim": int(op.weight.shape[0])}
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
    if type(op).__name__ == "RobustStreamOperator":
        return "robust"
    raise ValueError(f"Cannot save a {type(op).__name__} operator: ghosted saves StreamOperator, "
                     "BranchOperator and RobustStreamOperator.")


# --------------------------------------------------------------------------------------- recipe
def build_recipe(model: nn.Module, operators: list[dict], recipe=None, loaded=None) -> dict:
    """The ``ghosted_recipe.json`` content for ``model``: how it was made and how to load it.

    ``recipe`` is a ``RecoveryRun`` (settings, dropped layers and calibration protocol are read
    from it), a dict of fields that override the inferred ones, or None.
    """
    from ghosted.pipeline import versions

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


def read_recipe(path: str | Path) -> dict:
    """The recipe of a saved folder, or {} when it has none (a model not saved by ghosted)."""
    file = Path(path) / RECIPE_FILE
    return json.loads(file.read_text()) if file.exists() else {}


# -------------------------------------------------------------------------------------- loading
def load_recovered(path: str | Path, device: str = "auto", dtype: str = "auto",
                   device_map: str | dict | None = None, **options):
    """Load a folder written by ``save_recovered``: the model with its operators re-attached.

    Returns a ``LoadedModel`` (``.model``, ``.tokenizer``; ``.extra["recipe"]`` holds the recipe).
    ``device``, ``dtype`` and ``device_map`` are those of ``ghosted.loading.load_model``; the
    operators stay in float32 and follow the stream to its device.

    Example:
        >>> lm = load_recovered("smollm2-ghost")
        >>> lm.extra["recipe"]["dropped_spec"]       # "20-26"
    """
    from ghosted.loading import load_model

    started = time.perf_counter()
    folder = Path(path).expanduser()
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder} is not a saved model folder (no config.json).")
    if any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        lm = load_model(str(folder), device=device, dtype=dtype, device_map=device_map, **options)
    else:  # saved without a tokenizer: the model alone
        lm = _load_without_tokenizer(folder, device, dtype, device_map, **options)
    recipe = read_recipe(folder)
    n_ops = attach_saved_operators(lm.model, folder)
    lm.extra.update(recipe=recipe, operators=n_ops)  # kind stays "folder": a local model folder
    lm.load_seconds = time.perf_counter() - started
    return lm


def _load_without_tokenizer(folder: Path, device: str, dtype: str, device_map, **options):
    from transformers import AutoModelForCausalLM

    from ghosted.loading import LoadedModel, resolve_device, resolve_dtype

    where = resolve_device(device) if device_map is None else "device_map"
    torch_dtype = resolve_dtype(dtype, "cuda" if where == "device_map" and torch.cuda.is_available() else where)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, device_map=device_map, **options)
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
    if not file.exists():
        return 0
    with safe_open(str(file), framework="pt") as handle:
        entries = json.loads(handle.metadata()["ghosted_operators"])
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
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


def _rebuild(entry: dict, tensors: dict[str, torch.Tensor], context) -> nn.Module:
    key, boundary, method = entry["key"], tuple(entry["boundary"]), entry["method"]
    weight = tensors[f"{key}.weight"]  # (d, d) float32
    if entry["kind"] == "stream":
        return StreamOperator(weight, boundary, method)
    if entry["kind"] == "branch":
        return BranchOperator(weight, boundary, method)
    if entry["kind"] == "robust":
        from ghosted.patch import RobustStreamOperator
        from ghosted.sinks import SinkMap

        sink_map = SinkMap(constant=tensors[f"{key}.sink_constant"], linear=tensors.get(f"{key}.sink_linear"))
        return RobustStreamOperator(weight, sink_map, context, boundary, method)
    raise ValueError(f"Unknown operator kind {entry['kind']!r} in {OPERATORS_FILE}; a newer ghosted "
                     "may have written it.")


def _sink_context(model: nn.Module, entries: list[dict]):
    """One shared sink context for robust operators, fed by a pre-hook on the layer stack."""
    rules = [entry["sink_rule"] for entry in entries if entry["kind"] == "robust"]
    if not rules:
        return None
    from ghosted.arch import stack_of
    from ghosted.sinks import SinkContext, SinkRule

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
