"""One pass of windows through a lazy model, layer by layer: each decoder layer is read once per pass.

The whole-model path runs batch by batch through every layer; this runs layer by layer through every
batch. Per pass:

  1. *Prelude* (embedding resident): the stack's own forward runs with every decoder layer replaced by
     a recorder, so the model's own code computes the embedding, the positions, the rotary tables and
     each layer's attention mask (per layer type: sliding and full); the recorder keeps, per batch and
     layer, exactly the arguments that layer would receive.
  2. *Layers*: layer i is made resident, every variant that keeps it runs it on each batch's stream
     with the recorded arguments, the layer is freed. Variants whose streams are still equal (dense and
     a pruned model before its first gap, each variant holding the very same layer object) share one
     computation and one stream; a stream no variant holds any more is freed.
  3. *Tail* (final norm and head resident): ``Tail.normed`` runs the stack's own forward again with
     every layer returning the final stream, so the final norm (and OPT's projection) are the model's
     own; ``Tail.logits`` applies the head (and Gemma's soft-capping) to a chunk of positions.

The layers see the same tensors as in the whole-model forward, so the streams are bitwise equal.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ghosted.core.progress import Progress, for_stage
from ghosted.models.architecture import embedding_of, get_path, head_of, hidden_of, layers_of, spec_for, stack_of
from ghosted.models.capture import StopForward
from ghosted.models.lazy import LazyModel
from ghosted.models.pruning import original_indices

Batch = tuple[torch.Tensor, torch.Tensor | None]  # (B, T) ids, (B, T) mask or None
OnStream = Callable[[str, int, int, torch.Tensor], None]  # (variant, boundary or layer, batch index, (B, T, d))


@dataclass
class Recorded:
    """What the prelude found for one batch: the embedded stream and each layer's other arguments."""

    embedded: torch.Tensor  # (B, T, d) the stream entering layer 0
    calls: list[tuple[tuple, dict]] = field(default_factory=list)  # per layer: (args after the stream, kwargs)


@contextmanager
def _replaced_forwards(layers: nn.ModuleList, make: Callable[[int], Callable]):
    """Within the block, layer i's ``forward`` is ``make(i)`` (on the instance; removed on exit)."""
    try:
        for i, layer in enumerate(layers):
            layer.forward = make(i)
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


class LayerPass:
    """Runs batches of windows through ``lazy``'s layers for several variants at once."""

    def __init__(self, lazy: LazyModel):
        self.lazy = lazy
        model = lazy.model
        self.stack = stack_of(model)
        self.layers = layers_of(model)
        self.embedding, self.head = embedding_of(model), head_of(model)
        inner = {id(p) for m in (*self.layers, self.embedding, self.head) for p in m.parameters()}
        self.outer = [m for m in model.modules() if any(id(p) not in inner for p in m.parameters(recurse=False))]

    def _stack_call(self, ids: torch.Tensor, mask: torch.Tensor | None, embeds: torch.Tensor | None = None):
        device = self.lazy.device
        kwargs = dict(attention_mask=None if mask is None else mask.to(device), use_cache=False)
        if embeds is None:
            return self.stack(input_ids=ids.to(device), **kwargs)
        return self.stack(inputs_embeds=embeds, **kwargs)

    @torch.no_grad()
    def prelude(self, batches: list[Batch]) -> list[Recorded]:
        """Each batch's embedded stream and per-layer arguments, from the stack's own forward."""
        out: list[Recorded] = []
        last = len(self.layers) - 1

        def recorder(i: int):
            def forward(*args, **kwargs):
                hidden = args[0] if args else kwargs.pop("hidden_states")
                if i == 0:
                    out[-1].embedded = hidden
                out[-1].calls.append((args[1:], kwargs))
                if i == last:
                    raise StopForward
                return hidden
            return forward

        with self.lazy.resident(self.embedding, *self.outer), _replaced_forwards(self.layers, recorder):
            for ids, mask in batches:
                out.append(Recorded(embedded=None))
                try:
                    self._stack_call(ids, mask)
                except StopForward:
                    pass
        return out

    @torch.no_grad()
    def run(self, batches: list[Batch], variants: dict[str, nn.Module], *, until: int | None = None,
            boundaries: dict[str, set[int]] | None = None, on_boundary: OnStream | None = None,
            mlp: dict[str, set[int]] | None = None, on_mlp: OnStream | None = None,
            progress: Progress | None = None, label: str = "layer-wise pass") -> dict[str, list[torch.Tensor]]:
        """The stream of every variant after its last layer (before the final norm), per batch.

        ``until`` stops after original layer ``until - 1`` (the streams returned then enter ``until``).
        ``on_boundary(name, b, batch, x)`` gets the stream of variant ``name`` entering original layer b
        (b = number of layers: the output of the last) for each b in ``boundaries[name]``; ``on_mlp``
        gets the MLP-branch output of the layers in ``mlp[name]`` (original indices).
        """
        total = len(self.layers) if until is None else until
        recorded = self.prelude(batches)
        positions = {name: {orig: pos for pos, orig in enumerate(original_indices(v))} for name, v in variants.items()}
        streams: dict[int, list[torch.Tensor]] = {0: [r.embedded for r in recorded]}
        holds = dict.fromkeys(variants, 0)  # variant -> stream id
        step = for_stage(progress, label)
        step(0, total)
        with self.lazy.resident(*self.outer):
            for i in range(total):
                self._boundary(i, streams, holds, boundaries, on_boundary)
                users = {name: layers_of(variants[name])[positions[name][i]]
                         for name in variants if i in positions[name]}
                if users:
                    with self.lazy.resident(self.layers[i]), self._mlp_hooks(i, users, mlp, on_mlp):
                        self._advance(i, users, recorded, streams, holds)
                step(i + 1, total)
            self._boundary(total, streams, holds, boundaries, on_boundary)
        return {name: streams[key] for name, key in holds.items()}

    def _advance(self, i: int, users: dict[str, nn.Module], recorded: list[Recorded],
                 streams: dict[int, list[torch.Tensor]], holds: dict[str, int]) -> None:
        """Run layer i once for each distinct (stream, layer object) among its users; free unheld streams."""
        groups: dict[tuple[int, int], list[str]] = {}
        for name, layer in users.items():
            groups.setdefault((holds[name], id(layer)), []).append(name)
        for (source, _), names in groups.items():
            layer, new = users[names[0]], []
            self._current = names
            for self._batch, (x, rec) in enumerate(zip(streams[source], recorded)):
                self._seq_len = x.size(1)
                new.append(hidden_of(layer(x, *rec.calls[i][0], **rec.calls[i][1])))  # (B, T, d)
            key = max(streams) + 1
            streams[key] = new
            for name in names:
                holds[name] = key
        for key in [k for k in streams if k not in holds.values()]:
            del streams[key]

    @staticmethod
    def _boundary(b: int, streams, holds, boundaries, on_boundary) -> None:
        if not boundaries or on_boundary is None:
            return
        for name, wanted in boundaries.items():
            if b in wanted:
                for index, x in enumerate(streams[holds[name]]):
                    on_boundary(name, b, index, x)

    @contextmanager
    def _mlp_hooks(self, i: int, users: dict[str, nn.Module], mlp, on_mlp):
        """A forward hook on the MLP branch of layer i of each variant that asked for it, removed on exit."""
        wanted = {name for name in users if mlp and on_mlp and i in mlp.get(name, ())}
        branch = spec_for(self.lazy.model).mlp_branch
        modules = {id(get_path(users[n], branch)): get_path(users[n], branch) for n in wanted}
        with ExitStack() as stack:
            for module in modules.values():
                stack.callback(module.register_forward_hook(self._mlp_hook(i, wanted, on_mlp)).remove)
            yield

    def _mlp_hook(self, i: int, wanted: set[str], on_mlp: OnStream):
        def hook(module, args, output):
            hidden = hidden_of(output)
            if hidden.dim() == 2:  # OPT runs its MLP on flattened (B·T, d) tokens
                hidden = hidden.view(-1, self._seq_len, hidden.size(-1))  # (B, T, d)
            for name in self._current:
                if name in wanted:
                    on_mlp(name, i, self._batch, hidden)
        return hook

    @contextmanager
    def tail(self):
        """Within the block, the final norm and the head are resident: a ``Tail`` to apply them."""
        with self.lazy.resident(self.head, *self.outer):
            yield Tail(self)


class Tail:
    """The part of the model after the last layer: final norm (``normed``) and head (``logits``)."""

    def __init__(self, runner: LayerPass):
        self.runner = runner
        self.cap = getattr(runner.lazy.model.config, "final_logit_softcapping", None)

    @torch.no_grad()
    def normed(self, hidden: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The final stream (B, T, d) through the stack's own end (final norm, projection)."""
        runner = self.runner

        def returning(i: int):
            return lambda *args, **kwargs: hidden
        zeros = torch.zeros_like(hidden)  # (B, T, d) stands in for the embeddings, which every layer ignores
        with _replaced_forwards(runner.layers, returning):
            return runner._stack_call(ids, mask, embeds=zeros).last_hidden_state

    @torch.no_grad()
    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits (B, t, V) of normed positions (B, t, d)."""
        logits = self.runner.head(normed)  # (B, t, V)
        if self.cap:
            logits = torch.tanh(logits / self.cap) * self.cap
        return logits
