"""``bundled-lastword``: an offline LAMBADA-style task on the evaluation part of the bundled Wikipedia text.

Why: offline there is no zero-shot task at all, yet a user should see what pruning costs in accuracy,
not only in perplexity. LAMBADA asks a model for the last word of a passage given the rest of it;
this task asks the same of paragraphs of the bundled Wikipedia sample.

The task (``VERSION`` 1):
  * paragraphs of the *evaluation* part of ``bundled:wiki`` (its last 20 % of articles; calibration
    text is never used), one paragraph per line of a cleaned article;
  * kept when they end with ``.``, ``!`` or ``?`` and, once that final punctuation is removed, have
    ``MIN_WORDS``..``MAX_WORDS`` words and an alphabetic last word (no digits, hyphens or quotes);
  * shuffled with ``random.Random(SEED)`` and the first ``SIZE`` kept, so ``limit=N`` (lm-eval's
    ``--limit``, the first N documents) is a seeded random sample of N paragraphs;
  * context = every word but the last, joined by single spaces; target = " " + the last word.

Scoring, as lm-evaluation-harness scores ``loglikelihood`` tasks (``HFLM``): the pair is tokenised
as ``encode(context + target)`` split after ``len(encode(context))`` tokens, left-truncated to the
model's maximum length, run right-padded without an attention mask; an example is correct when
every target token is the argmax of the logits before it (greedy), and its log-likelihood is the
sum of the target tokens' log-probabilities. Accuracy and mean log-likelihood are reported with
their standard errors (sample standard deviation / sqrt(n), as lm-eval's ``mean_stderr``).

``score_lastword`` scores K variants of one model at the cost of one shared prefix plus K suffixes
per batch (``ghosted.evaluation.shared_prefix``), exactly like the shared-prefix perplexity. The same task runs
inside lm-evaluation-harness from ``ghosted/evaluation/tasks/bundled_lastword.yaml``; a test checks both agree.

Example:
    >>> res = score_lastword({"dense": lm.model, "ghost": ghost}, lm.tokenizer, limit=200)
    >>> res["ghost"].acc, res["ghost"].acc_stderr, res["ghost"].loglikelihood
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from ghosted.core.progress import Progress, counted

TASK = "bundled-lastword"  # the task's name, in the CLI, the app and lm-eval
VERSION = 1  # bump when the selection or the scoring below changes
SOURCE = "bundled:wiki"  # the bundled Wikipedia sample; its evaluation part only
MIN_WORDS, MAX_WORDS = 30, 300  # paragraph length in words (enough context, bounded cost)
SIZE = 500  # examples in the task (of ~860 paragraphs that qualify)
SEED = 0  # the shuffle that orders the paragraphs
ENDINGS = ".!?"  # a paragraph must end a sentence; the final mark is removed
DEFAULT_MAX_LENGTH = 2048  # lm-eval's fallback when neither the config nor the tokenizer names one


def qualifies(paragraph: str) -> bool:
    """True when ``paragraph`` ends a sentence and has MIN_WORDS..MAX_WORDS words, the last alphabetic."""
    if not paragraph or paragraph[-1] not in ENDINGS:
        return False
    words = paragraph.rstrip(ENDINGS).split(" ")
    return MIN_WORDS <= len(words) <= MAX_WORDS and words[-1].isalpha()


@lru_cache(maxsize=2)
def _all_examples(source: str = SOURCE) -> tuple[dict, ...]:
    """Every example of the task, in task order (shuffled with SEED, at most SIZE)."""
    from ghosted.data.sources import resolve_source

    rows = []
    for article, document in enumerate(resolve_source(source).part("evaluation")):
        for paragraph in document.split("\n"):
            if qualifies(paragraph):
                words = paragraph.rstrip(ENDINGS).split(" ")
                rows.append({"article": article, "text": " ".join(words), "context": " ".join(words[:-1]),
                             "target": " " + words[-1]})
    random.Random(SEED).shuffle(rows)
    return tuple({"id": i, **row} for i, row in enumerate(rows[:SIZE]))


def examples(limit: int | None = None) -> list[dict]:
    """The first ``limit`` examples (all when None): dicts with id, article, text, context, target."""
    rows = _all_examples()
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1 (got {limit}); leave it out for all {len(rows)} examples.")
    return [dict(row) for row in rows[:limit]]


def max_length(model: nn.Module, tokenizer) -> int:
    """The context limit lm-eval's HFLM uses for ``model``: config, then tokenizer, then 2048."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    for attr in ("n_positions", "max_position_embeddings", "n_ctx"):
        if getattr(config, attr, None) is not None:
            return int(getattr(config, attr))
    tok_max = getattr(tokenizer, "model_max_length", None)
    return int(tok_max) if tok_max is not None and tok_max < 1e29 else DEFAULT_MAX_LENGTH


def encode_pair(tokenizer, context: str, target: str, limit: int) -> tuple[list[int], list[int]]:
    """(model input ids, target ids), as HFLM builds them for one request.

    Spaces ending the context move to the target; the whole text is encoded and split after the
    context's own encoding; the sequence (minus its last token, which is only predicted) is
    left-truncated to ``limit`` tokens.
    """
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, target = context[:-spaces], context[-spaces:] + target
    whole = tokenizer.encode(context + target)
    n_context = len(tokenizer.encode(context))
    if n_context < 1 or len(whole) <= n_context:
        raise ValueError(f"Cannot score {target!r} after {context[-40:]!r}: empty context or target tokens.")
    return whole[-(limit + 1):][:-1], whole[n_context:]


@dataclass
class LastWordScore:
    """One model's result: accuracy and mean log-likelihood with standard errors, per-example values."""

    acc: float  # share of examples whose whole last word is the greedy continuation
    acc_stderr: float
    loglikelihood: float  # mean over examples of the summed log-probability of the target tokens
    loglikelihood_stderr: float
    examples: int
    seconds: float
    correct: list[bool] = field(default_factory=list, repr=False)  # per example, in task order
    logprobs: list[float] = field(default_factory=list, repr=False)

    def as_metrics(self) -> dict[str, float]:
        return {"acc": self.acc, "acc_stderr": self.acc_stderr, "loglikelihood": self.loglikelihood,
                "loglikelihood_stderr": self.loglikelihood_stderr}


def mean_stderr(values: list[float]) -> tuple[float, float]:
    """(mean, sample standard deviation / sqrt(n)), lm-eval's ``mean`` and ``mean_stderr``."""
    n = len(values)
    mean = sum(values) / max(n, 1)
    if n < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


@dataclass
class _Batch:
    """Right-padded input ids of a batch and, per row, its length and target length."""

    ids: torch.Tensor  # (B, T) long, zero-padded on the right
    lengths: list[int]
    targets: list[list[int]]
    rows: list[int]  # example indices (task order)


def _batches(encoded: list[tuple[list[int], list[int]]], batch_size: int) -> list[_Batch]:
    """Longest examples first (as HFLM), so padding stays small and memory peaks early."""
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i][0]))
    out = []
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        width = len(encoded[rows[0]][0])
        ids = torch.zeros(len(rows), width, dtype=torch.long)  # (B, T)
        for r, i in enumerate(rows):
            ids[r, :len(encoded[i][0])] = torch.tensor(encoded[i][0])
        out.append(_Batch(ids, [len(encoded[i][0]) for i in rows], [encoded[i][1] for i in rows], rows))
    return out


def _judge(logits: torch.Tensor, batch: _Batch) -> list[tuple[float, bool]]:
    """(summed target log-prob, all targets greedy) per row of a batch's logits (B, T, V)."""
    logp = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    out = []
    for r, (length, target) in enumerate(zip(batch.lengths, batch.targets)):
        targets = torch.tensor(target, device=logp.device)  # (n,)
        rows = logp[r, length - len(target):length]  # (n, V): the positions that predict the targets
        greedy = bool((rows.argmax(dim=-1) == targets).all())
        out.append((float(rows.gather(1, targets[:, None]).sum()), greedy))
    return out


@torch.no_grad()
def score_lastword(models: dict[str, nn.Module], tokenizer, limit: int | None = None, batch_size: int = 8,
                   share: bool = True, progress: Progress | None = None) -> dict[str, LastWordScore]:
    """``bundled-lastword`` accuracy and log-likelihood of every model (see the module docstring).

    Variants that hold the same leading layers (``ghosted.evaluation.shared_prefix.shared_prefix_length``) run
    them once per batch; ``share=False`` runs every model whole. Models are not modified. ``progress``
    gets one step per batch: one stage for the shared run, one stage per model otherwise.
    """
    from ghosted.models.capture import input_device, tap
    from ghosted.evaluation.shared_prefix import SuffixView, shared_prefix_length

    items = list(models.items())
    rows = examples(limit)
    limit_tokens = min(max_length(m, tokenizer) for _, m in items)
    encoded = [encode_pair(tokenizer, row["context"], row["target"], limit_tokens) for row in rows]
    batches = _batches(encoded, batch_size)
    k = shared_prefix_length([m for _, m in items]) if share else 0
    answers: dict[str, list] = {name: [None] * len(rows) for name, _ in items}
    seconds = dict.fromkeys(answers, 0.0)

    def record(name: str, batch: _Batch, logits: torch.Tensor, started: float) -> None:
        for i, answer in zip(batch.rows, _judge(logits, batch)):
            answers[name][i] = answer
        seconds[name] += time.perf_counter() - started

    if k:
        suffixes = {name: SuffixView(model, k) for name, model in items}
        with tap(items[0][1], boundaries=[k]) as prefix:
            for batch in counted(batches, progress, f"{TASK} x{len(items)} (shared {k} layers)"):
                t0 = time.perf_counter()
                hidden = prefix.run(batch.ids).resid[k]  # (B, T, d): the layers every variant shares
                share_s = (time.perf_counter() - t0) / len(items)
                for name, suffix in suffixes.items():
                    t1 = time.perf_counter() - share_s  # the suffix's time plus its share of the prefix
                    record(name, batch, suffix.logits(hidden, batch.ids, None), t1)
    else:
        for name, model in items:
            for batch in counted(batches, progress, f"{TASK} {name}"):
                t0 = time.perf_counter()
                logits = model(input_ids=batch.ids.to(input_device(model)), use_cache=False).logits  # (B, T, V)
                record(name, batch, logits, t0)
    return {name: _score(answers[name], seconds[name]) for name, _ in items}


def _score(answers: list[tuple[float, bool]], seconds: float) -> LastWordScore:
    logprobs = [ll for ll, _ in answers]
    correct = [greedy for _, greedy in answers]
    acc, acc_err = mean_stderr([float(c) for c in correct])
    ll, ll_err = mean_stderr(logprobs)
    return LastWordScore(acc, acc_err, ll, ll_err, len(answers), round(seconds, 2), correct, logprobs)


def protocol(limit: int | None = None) -> dict:
    """What ``bundled-lastword`` scored: task, version, examples, few-shot, metrics, text and rule."""
    return {"task": TASK, "version": VERSION, "examples": len(examples(limit)), "num_fewshot": 0,
            "metric": "acc", "metrics": ["acc", "loglikelihood"], "scorer": "ghosted (shared prefix)",
            "source": f"{SOURCE} (evaluation part)",
            "selection": f"paragraphs of {MIN_WORDS}-{MAX_WORDS} words ending a sentence, alphabetic last "
                         f"word, shuffled with seed {SEED}, first {SIZE}"}
