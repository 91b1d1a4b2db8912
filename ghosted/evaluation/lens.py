"""What the cut did, read layer by layer and token by token.

Two views for comparing a dense model with its pruned and recovered variants on one text:

  * ``token_losses``: each token's next-token loss under every model and its change against the
    dense model, with the tokens the cut hurt most and the ones a recovery repaired most;
  * ``logit_lens``: the top next-token prediction read from the residual stream at every layer
    boundary (final norm and output head applied, as the model itself does after its last layer),
    so one sees at which depth each model "knows" the next token, and whether the stream a
    recovery hands the later layers is one they can read.

Both run each model once on the text, whole (no sharing is needed for one short text); the lens
taps the streams through ``ghosted.models.capture.tap`` (hooks on a private view, always removed),
and reads them out through the architecture adapter, so every supported family works.

Example:
    >>> losses = token_losses({"dense": m, "pruned": p, "ghost": g}, tokenizer, text)
    >>> losses.most_hurt("pruned"), losses.most_repaired("ghost", "pruned")
    >>> logit_lens({"dense": m, "pruned": p, "ghost": g}, tokenizer, "The capital of France is")
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import nn

from ghosted.evaluation.perplexity import model_logits
from ghosted.evaluation.scores import score_logits
from ghosted.models.architecture import get_path, num_layers, spec_for
from ghosted.models.capture import input_device, tap
from ghosted.models.pruning import original_indices


def encode(tokenizer, text: str, max_tokens: int = 512) -> torch.Tensor:
    """(1, T) ids of ``text`` (its first ``max_tokens``); ValueError when it has no token."""
    if not isinstance(text, str):
        raise TypeError(f"The text must be a string; got {type(text).__name__}.")
    ids = list(tokenizer(text)["input_ids"])[:max_tokens]
    if not ids:
        raise ValueError("The text gave no token: give some text to read.")
    return torch.tensor([ids])


def token_strings(tokenizer, ids) -> list[str]:
    """Each id as the text it stands for (decoded one by one, so spaces and newlines stay visible)."""
    decode = getattr(tokenizer, "decode", None)
    return [decode([int(i)]) if decode else str(int(i)) for i in ids]


@dataclass
class TokenLosses:
    """Per-token next-token loss of each model on one text, and the change against the reference."""

    frame: pd.DataFrame  # position, token, then "<model>" (loss, nats) and "<model> Δ" (loss - reference's)
    reference: str  # the dense model's name

    def most_hurt(self, model: str, k: int = 10) -> pd.DataFrame:
        """The ``k`` tokens whose loss ``model`` raised most against the reference."""
        return self.frame.nlargest(k, f"{model} Δ")[["position", "token", self.reference, model, f"{model} Δ"]]

    def most_repaired(self, model: str, cut: str, k: int = 10) -> pd.DataFrame:
        """The ``k`` tokens whose loss ``model`` brought down most from the ``cut`` (pruned) model's."""
        frame = self.frame.assign(repaired=self.frame[cut] - self.frame[model])
        return frame.nlargest(k, "repaired")[["position", "token", self.reference, cut, model, "repaired"]]


@torch.no_grad()
def token_losses(models: dict[str, nn.Module], tokenizer, text: str, reference: str = "dense",
                 max_tokens: int = 512) -> TokenLosses:
    """Each token's loss under every model of ``models`` (``reference`` among them) on ``text``."""
    if reference not in models:
        raise ValueError(f"token_losses compares with the reference model {reference!r}; give it among the models "
                         f"(got {', '.join(models)}).")
    ids = encode(tokenizer, text, max_tokens)  # (1, T)
    if ids.size(1) < 2:
        raise ValueError("The text has one token: a next-token loss needs at least two.")
    frame = pd.DataFrame({"position": range(1, ids.size(1)), "token": token_strings(tokenizer, ids[0, 1:])})
    for name, model in models.items():
        _, logprobs = score_logits(model_logits(model, ids), ids, None)  # (1, T-1, V)
        target = ids[:, 1:].to(logprobs.device).unsqueeze(-1)  # (1, T-1, 1)
        frame[name] = (-logprobs.gather(-1, target)).squeeze(-1)[0].double().cpu().numpy()
    for name in models:
        if name != reference:
            frame[f"{name} Δ"] = frame[name] - frame[reference]
    return TokenLosses(frame, reference)


def read_out(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Logits (..., V) from a residual stream (..., d), as the model turns its last layer's output into
    logits: the final norm, any projection after it (OPT), the output head and a logit soft-cap (Gemma)."""
    spec = spec_for(model)
    stack = get_path(model, spec.stack)
    norm = getattr(stack, spec.final_norm, None)
    if norm is not None:
        hidden = norm(hidden)
    project = getattr(stack, "project_out", None)
    if project is not None:
        hidden = project(hidden)
    head = model.get_output_embeddings()
    logits = head(hidden.to(head.weight.dtype))
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


@torch.no_grad()
def boundary_logits(model: nn.Module, ids: torch.Tensor, position: int = -1, depth: int | None = None
                    ) -> dict[int, torch.Tensor]:
    """{original boundary: logits (V,) read at ``position``} for every boundary of ``model``.

    Boundary keys are in the dense model's numbering (a pruned model's kept layers keep their original
    index); the last one, after the final layer, is keyed by ``depth``, the dense model's layer count
    (default: one past the last layer this model kept).
    """
    n = num_layers(model)
    origin = original_indices(model)
    depth = depth or origin[-1] + 1
    with tap(model, boundaries=list(range(n + 1))) as t:
        streams = t.run(ids.to(input_device(model))).resid  # {b: (1, T, d)}
    keys = [*origin, depth]
    return {keys[b]: read_out(model, streams[b][0, position]).float() for b in range(n + 1)}


def logit_lens(models: dict[str, nn.Module], tokenizer, prompt: str, position: int = -1,
               max_tokens: int = 512) -> pd.DataFrame:
    """One row per layer boundary (dense numbering), for each model its top next-token prediction and its
    probability, read from the stream at ``position`` of ``prompt``; a boundary a model does not have
    (inside its cut) is empty. The last row is each model's own prediction."""
    ids = encode(tokenizer, prompt, max_tokens)  # (1, T)
    depth = max(original_indices(m)[-1] + 1 for m in models.values())  # the dense model's, when it is given
    columns = {}
    for name, model in models.items():
        for boundary, logits in boundary_logits(model, ids, position, depth).items():
            probs = torch.softmax(logits, -1)  # (V,)
            top = int(probs.argmax())
            columns.setdefault(boundary, {})[name] = token_strings(tokenizer, [top])[0]
            columns[boundary][f"{name} p"] = float(probs[top])
    rows = [{"boundary": b, **columns[b]} for b in sorted(columns)]
    return pd.DataFrame(rows)
