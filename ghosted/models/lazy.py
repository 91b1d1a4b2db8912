"""A model whose weights stay in the checkpoint until a module needs them: one decoder layer at a time.

The model is built from its config with every parameter on the ``meta`` device (buffers such as the
rotary frequencies are computed for real, so nothing non-persistent is left on ``meta``). ``resident``
reads the tensors of the modules it is given from the safetensors shards, swaps them into the very
parameter objects of the skeleton (``torch.utils.swap_tensors``: every view built from the skeleton by
``build_variant`` shares those objects, so pruned and recovered variants see the weights too), and swaps
``meta`` back in on exit, which frees them. Every shard, tensor name and shape is checked against the
skeleton before any compute, so a bad checkpoint is one clear error naming the file and the tensor.

Example:
    >>> lazy = LazyModel("./Llama-3.1-8B", dtype=torch.bfloat16, device="cuda")
    >>> with lazy.resident(layers_of(lazy.model)[0]):
    ...     ...                                  # layer 0 holds real weights here, and only here
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from ghosted.core.untrusted import check_safetensors_header, confined_file, read_json_file

INDEX_FILE = "model.safetensors.index.json"
_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class CheckpointError(ValueError):
    """A checkpoint that cannot be read layer by layer; the message names the file and the tensor."""


class Checkpoint:
    """Where each tensor of a safetensors checkpoint lives (file, shape, dtype), from the headers only."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.entries: dict[str, tuple[Path, tuple[int, ...], str]] = {}
        for file, names in self._files().items():
            header = _header(file)
            for name in names if names is not None else [n for n in header if n != "__metadata__"]:
                if name not in header:
                    raise CheckpointError(f"{self.folder / INDEX_FILE} puts tensor {name!r} in {file}, but that "
                                          "file does not hold it: the shard is from another download. Download "
                                          "the checkpoint again.")
                entry = header[name]
                self.entries[name] = (file, tuple(entry["shape"]), entry["dtype"])

    def _files(self) -> dict[Path, list[str] | None]:
        """Shard -> the tensor names the index puts in it (None: every tensor of a single-file checkpoint)."""
        index = self.folder / INDEX_FILE
        if not index.exists():
            files = sorted(self.folder.glob("*.safetensors"))
            files = [f for f in files if not f.name.startswith("ghosted_")]  # operator files are not weights
            if not files:
                raise CheckpointError(f"{self.folder} holds no .safetensors weights, so it cannot be read layer by "
                                      "layer. A GGUF model is converted once by `ghosted run` (without "
                                      "--layerwise); pass the converted folder, or save the model with "
                                      "save_pretrained(safe_serialization=True).")
            return {f: None for f in files}
        try:
            weight_map = read_json_file(index, "checkpoint index")
        except (OSError, ValueError) as err:
            raise CheckpointError(f"{index} cannot be read ({err}). Download it again.") from None
        weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index} is damaged (no weight_map of tensor -> file). Download it again.")
        files: dict[Path, list[str]] = {}
        for name, shard in weight_map.items():
            try:
                file = confined_file(self.folder, shard, "weights shard")
            except FileNotFoundError:
                raise CheckpointError(f"{index} puts tensor {name!r} in {shard}, which is not in {self.folder}: "
                                      "an incomplete download. Download the missing shard.") from None
            except ValueError as err:
                raise CheckpointError(f"{index}: tensor {name!r}: {err}") from None
            files.setdefault(file, []).append(name)
        return files

    def read(self, names: Iterable[str], dtype: torch.dtype, device: torch.device | str) -> dict[str, torch.Tensor]:
        """The tensors ``names``, each cast to ``dtype`` (floating ones) on ``device``; one open per shard."""
        from safetensors import safe_open

        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.entries[name][0], []).append(name)
        out = {}
        for file, wanted in by_file.items():
            with safe_open(str(file), framework="pt", device="cpu") as handle:  # closed at once: no mapping kept
                for name in wanted:
                    tensor = handle.get_tensor(name)
                    tensor = tensor.to(dtype) if tensor.is_floating_point() else tensor
                    out[name] = tensor.to(device)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data in the checkpoint."""
        return sum(_bytes(shape, dtype) for _, shape, dtype in self.entries.values())


def _header(file: Path) -> dict:
    try:
        return check_safetensors_header(file)
    except (OSError, ValueError) as err:
        raise CheckpointError(str(err)) from None


def _bytes(shape: tuple[int, ...], dtype: str) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * (torch.finfo(_SAFETENSORS_DTYPES[dtype]).bits // 8 if dtype in _SAFETENSORS_DTYPES else 4)


class LazyModel:
    """A causal LM skeleton on ``meta`` whose modules read their weights from ``folder`` on demand."""

    def __init__(self, folder: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu",
                 trust_remote_code: bool = False):
        from accelerate import init_empty_weights
        from transformers import AutoConfig, AutoModelForCausalLM

        self.folder = Path(folder)
        self.dtype, self.device = dtype, torch.device(device)
        self.bytes_read = 0  # bytes ``resident`` has read from the checkpoint so far
        self.checkpoint = Checkpoint(self.folder)
        config = AutoConfig.from_pretrained(self.folder, trust_remote_code=trust_remote_code)
        with init_empty_weights(include_buffers=False):  # parameters on meta, buffers computed for real
            model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
        model.tie_weights()  # tied embeddings: the head is the embedding's very parameter, as after loading
        model.eval()
        model.requires_grad_(False)
        model.ghosted_lazy = self  # views (``build_variant``'s shallow clones) carry it: ``lazy_of`` finds it
        model.register_forward_pre_hook(_whole_call, with_kwargs=True)  # views copy the hook with the dict
        self.model = model
        self._names = self._checked_names()
        self._load_buffers()

    def _checked_names(self) -> dict[int, str]:
        """id(parameter) -> its name in the checkpoint, once every parameter is there with its shape."""
        aliases: dict[int, list[str]] = {}
        tensors: dict[int, torch.Tensor] = {}
        for name, param in self.model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(param), []).append(name)
            tensors[id(param)] = param
        names, stored = {}, _model_names(self.model, self.checkpoint)
        for key, options in aliases.items():
            found = [stored[n] for n in options if n in stored]
            if not found:
                raise CheckpointError(f"Tensor {options[0]!r} of this {type(self.model).__name__} is in no shard of "
                                      f"{self.folder}: the checkpoint is incomplete or of another architecture.")
            file, shape, dtype = self.checkpoint.entries[found[0]]
            if tensors[key].is_floating_point() and dtype not in _SAFETENSORS_DTYPES:
                raise CheckpointError(f"Tensor {found[0]!r} in {file} is stored as {dtype}, not as a floating-point "
                                      "type: the file is damaged or not this model's. Download it again.")
            if shape != tuple(tensors[key].shape):
                raise CheckpointError(f"Tensor {found[0]!r} in {file} has shape {list(shape)}, but the config asks "
                                      f"for {list(tensors[key].shape)}: the weights do not belong to this config.")
            names[key] = found[0]
        return names

    def _load_buffers(self) -> None:
        """Buffers to the device; the persistent ones the checkpoint holds are read from it (they are small)."""
        for prefix, module in self.model.named_modules():
            for name, buffer in list(module._buffers.items()):
                if buffer is None:
                    continue
                key = f"{prefix}.{name}" if prefix else name
                if key in self.checkpoint.entries:
                    buffer = self.checkpoint.read([key], buffer.dtype, self.device)[key]
                module._buffers[name] = buffer.to(self.device)

    def layer_bytes(self, module: nn.Module) -> int:
        """Bytes ``module``'s parameters take once resident (in the model's dtype)."""
        item = torch.finfo(self.dtype).bits // 8
        return sum(p.numel() * item for p in _unique_params([module]))

    @contextmanager
    def resident(self, *modules: nn.Module):
        """Within the block, the parameters of ``modules`` hold real weights read from the checkpoint."""
        params = [p for p in _unique_params(modules) if p.is_meta]
        loaded = self.checkpoint.read([self._names[id(p)] for p in params], self.dtype, self.device)
        self.bytes_read += sum(t.numel() * t.element_size() for t in loaded.values())
        swapped = []
        try:
            for param in params:
                torch.utils.swap_tensors(param, nn.Parameter(loaded.pop(self._names[id(param)]), requires_grad=False))
                swapped.append(param)
            yield
        finally:
            for param in swapped:  # the real tensor goes with the temporary Parameter: freed here
                torch.utils.swap_tensors(param, nn.Parameter(torch.empty_like(param, device="meta"),
                                                             requires_grad=False))


class LayerwiseUnsupported(RuntimeError):
    """A step that runs the whole model at once was asked of a model read layer by layer."""


def _whole_call(module, args, kwargs):
    require_whole(module, "this step")


def require_whole(model: nn.Module, what: str) -> None:
    """A clear ``LayerwiseUnsupported`` when ``model`` is read layer by layer and ``what`` needs it whole."""
    if lazy_of(model) is not None:
        raise LayerwiseUnsupported(
            f"This {type(model).__name__} is read layer by layer from its checkpoint (layerwise), and {what} runs "
            "the whole model at once, which the layer-wise path does not do: calibration statistics, fits and "
            "perplexity (with KL and top-1) run layer by layer; for the rest, load the model without layerwise.")


def lazy_of(model: nn.Module) -> LazyModel | None:
    """The ``LazyModel`` that ``model`` (its skeleton or a view of it) reads its weights from, else None."""
    return model.__dict__.get("ghosted_lazy") if isinstance(model, nn.Module) else None


def _model_names(model: nn.Module, checkpoint: Checkpoint) -> dict[str, str]:
    """Model parameter name -> checkpoint tensor name, through the renamings transformers applies on loading
    (``embed_out`` -> ``lm_head`` for GPT-NeoX, legacy ``gamma``/``beta``); a tensor transformers would merge
    or split cannot be read on its own, so it is refused by name."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        transforms = get_model_conversion_mapping(model)
    except (ImportError, AttributeError, TypeError):  # another transformers: names as stored
        return {name: name for name in checkpoint.entries}
    out = {}
    for stored in checkpoint.entries:
        name = stored
        for transform in transforms:
            renamed, matched = transform.rename_source_key(name)
            if matched is not None and not isinstance(transform, WeightRenaming):
                raise CheckpointError(f"Tensor {stored!r} of {checkpoint.entries[stored][0]} is converted by "
                                      "transformers on loading (merged or split with others), so it cannot be "
                                      "read layer by layer. Load the model whole (without layer-wise), or save "
                                      "it once with save_pretrained and pass that folder.")
            name = renamed
        out[name] = stored
    return out


def _unique_params(modules) -> list[nn.Parameter]:
    seen, out = set(), []
    for module in modules:
        for param in module.parameters():
            if id(param) not in seen:
                seen.add(id(param))
                out.append(param)
    return out


def is_lazy_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds safetensors weights (a single file or an index of shards)."""
    folder = Path(folder)
    return (folder / INDEX_FILE).exists() or any(folder.glob("*.safetensors"))

