"""Greedy or sampled continuations of a list of prompts, with the KV cache."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ghosted.models.capture import input_device
from ghosted.models.lazy import require_whole


@dataclass
class GenerationConfig:
    """How to continue prompts."""

    max_new_tokens: int = 40  # enough to judge fluency, short enough for a CPU demo
    greedy: bool = True  # deterministic; set False to sample
    temperature: float = 0.7  # sampling only
    top_p: float = 0.9  # sampling only
    seed: int = 0  # sampling only: same seed, same text
    chat: bool = False  # wrap each prompt in the tokenizer's chat template (instruct models)
    use_cache: bool = True  # the KV cache; False recomputes every step (for tests)


def _encode(tokenizer, prompts: list[str], chat: bool) -> dict:
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("This tokenizer has no chat template; turn the chat option off.")
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                 add_generation_prompt=True) for p in prompts]
    # Left padding: decoder-only models continue from the right edge. Passed per call, so a
    # tokenizer shared with other sessions keeps its own setting.
    return tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left",
                     add_special_tokens=not chat)


@torch.no_grad()
def generate(model: nn.Module, tokenizer, prompts: list[str] | str,
             config: GenerationConfig | None = None, **overrides) -> list[str]:
    """Continue each prompt; returns only the new text of each.

    Example:
        >>> generate(model, tok, ["Albert Einstein was"], max_new_tokens=20)
        [' a German-born physicist who ...']
    """
    require_whole(model, "generation")
    cfg = replace(config or GenerationConfig(), **overrides)  # the caller's config is left as it was
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts or any(not p.strip() for p in prompts):
        raise ValueError("Every prompt must contain some text.")
    batch = _encode(tokenizer, prompts, cfg.chat).to(input_device(model))
    sampling = {} if cfg.greedy else {"temperature": cfg.temperature, "top_p": cfg.top_p}
    if not cfg.greedy:
        torch.manual_seed(cfg.seed)
    out = model.generate(**batch, max_new_tokens=cfg.max_new_tokens, do_sample=not cfg.greedy,
                         use_cache=cfg.use_cache, pad_token_id=tokenizer.pad_token_id, **sampling)
    new_tokens = out[:, batch["input_ids"].shape[1]:]  # (B, new)
    return tokenizer.batch_decode(new_tokens, skip_special_tokens=True)


def first_departure(reference: str, text: str, tokenizer) -> int | None:
    """The token position (0-based, in ``reference``'s tokens) where ``text`` first departs from
    ``reference``; None when one continues the other to its end (no departure in what was generated).

    Both are tokenized the same way, so a shared prefix of text is a shared prefix of tokens.
    """
    ref = list(tokenizer(reference, add_special_tokens=False)["input_ids"])
    got = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return i
    return None if len(ref) == len(got) else min(len(ref), len(got))


def departures(outputs: dict[str, list[str]], tokenizer, reference: str = "dense") -> dict[str, list[int | None]]:
    """For every model but ``reference``, per prompt, where its greedy continuation first departs from the
    reference model's (``first_departure``); {} when the reference was not generated."""
    if reference not in outputs:
        return {}
    ref = outputs[reference]
    return {name: [first_departure(r, t, tokenizer) for r, t in zip(ref, texts)]
            for name, texts in outputs.items() if name != reference}
