"""What the cut did to each token, and what each layer boundary reads: two app requests on a fitted run.

``TokenLossRequest`` scores one short text under every variant of a run (dense, pruned, each recovered
model) and keeps each token's loss change against the dense model (``ghosted.evaluation.lens.token_losses``);
``LensRequest`` reads the top next-token prediction from the residual stream at every layer boundary of
every variant for one prompt (``ghosted.evaluation.lens.logit_lens``). Both are shaped like the requests of
``ghosted.service.workbench``: frozen, named by ``key()``, refused by ``check(cfg)`` before anything is
queued, computed by ``compute(lm, fitted, progress)`` into a frozen result the shared store keeps read-only.

The text is the user's own: it is named in the key by its content (hashed with everything else), never
read as a path, and a capped deployment bounds its length (``DeployConfig.check_probe``).

Example:
    >>> view = TokenLossRequest(fit=fit, passage="The cat sat on the mat.").compute(lm, fitted)
    >>> view.hurt(5), view.repaired("ghost", 5)
    >>> LensRequest(fit=fit, prompt="The capital of France is").compute(lm, fitted).frame
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from ghosted.evaluation.lens import TokenLosses, encode, logit_lens, token_losses, token_strings
from ghosted.service.deploy import DeployConfig
from ghosted.service.results import FittedRun
from ghosted.service.workbench import FitRequest, _Request, label, variants
from ghosted.recovery.methods import BASELINE_METHOD, RECOVERY, REFERENCE_METHOD, with_role

REFERENCE = label(REFERENCE_METHOD)  # the variant every loss change is measured against ("dense")
DEFAULT_SOURCE = "bundled:wiki"  # the default text is the start of this source's evaluation part
DEFAULT_CHARS = 400  # about how many characters of it (cut at the end of a sentence)
SHOWN = 10  # tokens listed in the most hurt / most repaired tables


def default_passage(source: str = DEFAULT_SOURCE, chars: int = DEFAULT_CHARS) -> str:
    """The first sentences (about ``chars`` characters) of ``source``'s evaluation part: text no run
    calibrated on, so the token view shows what the cut did on text the operators never saw."""
    from ghosted.data.sources import resolve_source

    document = resolve_source(source).part("evaluation")[0]
    ends = [m.end() for m in re.finditer(r"[.!?](?=\s)", document[:chars])]
    return document[:ends[-1]] if ends else document[:chars]


def _check_text(cfg: DeployConfig, text: str, max_tokens: int, what: str) -> None:
    """Refuse a text that is not a non-blank string, a token count below two, or what ``cfg`` caps."""
    if not isinstance(text, str):
        raise TypeError(f"The {what} must be a string; got {type(text).__name__}.")
    if not text.strip():
        raise ValueError(f"Type a {what} to read.")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 2:
        raise ValueError(f"Read at least 2 tokens of the {what}; got {max_tokens!r}.")
    cfg.check_probe(text, max_tokens)


def _cut_and_recovered(fitted: FittedRun) -> tuple[str, tuple[str, ...]]:
    """The plainly pruned variant's name and the recovered ones', in the run's order."""
    return label(BASELINE_METHOD), tuple(label(m) for m in with_role(fitted.methods, RECOVERY))


# --- the token view -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenView:
    """Each token's next-token loss under every variant on one text, and its change against dense."""

    losses: TokenLosses  # frame: position, token, "<variant>" (nats) and "<variant> Δ" (minus dense's)
    cut: str  # the plainly pruned variant ("pruned")
    recovered: tuple[str, ...]  # the recovered variants, in the run's order

    @property
    def frame(self) -> pd.DataFrame:
        return self.losses.frame

    @property
    def variants(self) -> tuple[str, ...]:
        """Every variant compared with dense: the pruned one first, then each recovered one."""
        return (self.cut, *self.recovered)

    def mean_change(self, variant: str) -> float:
        """``variant``'s loss change from dense's, averaged over the tokens read (nats)."""
        return float(self.frame[f"{variant} Δ"].mean())

    def hurt(self, k: int = SHOWN) -> pd.DataFrame:
        """The ``k`` tokens whose loss the cut raised most above the dense model's."""
        return self.losses.most_hurt(self.cut, k)

    def repaired(self, variant: str, k: int = SHOWN) -> pd.DataFrame:
        """The ``k`` tokens whose loss ``variant`` brought down most from the pruned model's."""
        return self.losses.most_repaired(variant, self.cut, k)


@dataclass(frozen=True)
class TokenLossRequest(_Request):
    """The token view: every variant of ``fit``'s run scores the first ``max_tokens`` tokens of ``passage``."""

    fit: FitRequest = field(default_factory=FitRequest)  # the run whose variants are compared
    passage: str = ""  # the text read (the user's own; named in the key by its content)
    max_tokens: int = 128  # tokens of it read (one pass per variant)
    kind = "token_losses"

    def check(self, cfg: DeployConfig) -> None:
        _check_text(cfg, self.passage, self.max_tokens, "text")

    def compute(self, lm, fitted: FittedRun, progress=None) -> TokenView:
        if progress is not None:
            progress("scoring each token", 0, 1)
        losses = token_losses(variants(lm, fitted), lm.tokenizer, self.passage, REFERENCE, self.max_tokens)
        return TokenView(losses, *_cut_and_recovered(fitted))


# --- the lens -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LensView:
    """The top next-token prediction read at every layer boundary of every variant, for one prompt."""

    frame: pd.DataFrame  # boundary (dense numbering), then "<variant>" (token) and "<variant> p" per variant
    variants: tuple[str, ...]  # dense, pruned, then each recovered variant
    removed: tuple[int, ...]  # the dropped layers: the cut models have no stream entering them
    tokens: tuple[str, ...]  # the prompt's tokens; the prediction is for the one after the last
    depth: int  # the dense model's layer count: boundary ``depth`` is after the last layer

    @property
    def answer(self) -> str | None:
        """The dense model's own prediction (its last boundary); None when the frame lacks that row."""
        rows = self.frame[self.frame.boundary == self.depth]
        return rows[self.variants[0]].iloc[0] if len(rows) else None


@dataclass(frozen=True)
class LensRequest(_Request):
    """The lens: every variant of ``fit``'s run reads ``prompt``; the stream at each boundary, at the last
    token, is turned into a next-token prediction with the final norm and the output head."""

    fit: FitRequest = field(default_factory=FitRequest)  # the run whose variants are read
    prompt: str = ""  # the prompt (the user's own; named in the key by its content)
    max_tokens: int = 64  # tokens of the prompt read (its first ones)
    kind = "lens"

    def check(self, cfg: DeployConfig) -> None:
        _check_text(cfg, self.prompt, self.max_tokens, "prompt")

    def compute(self, lm, fitted: FittedRun, progress=None) -> LensView:
        if progress is not None:
            progress("reading every boundary", 0, 1)
        models = variants(lm, fitted)
        frame = logit_lens(models, lm.tokenizer, self.prompt, max_tokens=self.max_tokens)
        tokens = token_strings(lm.tokenizer, encode(lm.tokenizer, self.prompt, self.max_tokens)[0])
        return LensView(frame, tuple(models), tuple(sorted(fitted.layers)), tuple(tokens),
                        int(frame.boundary.max()))
