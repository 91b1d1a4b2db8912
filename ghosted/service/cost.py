"""What a job of the app will cost before it is queued: peak memory and compute, from the model's shape.

A cap on a count is not a cap on cost: 8,192 evaluation tokens cost 3.4 GB in 512-token windows and
three times that in 2,048-token ones, and a run with 14 gaps and 11 methods fits 154 operators. So every
request is priced from the model's shape (``Shape``: layers, width, feed-forward width, vocabulary,
heads, bytes per weight) and its own settings (tokens, window, batch, methods, gaps, prompts, new tokens):

  * memory, the largest live set of one forward batch plus what the job keeps for its whole run:
    activations (B·T·d per stream, B·T·ffn in the MLP, B·H·T² attention scores), logits B·T·V in float32
    and their log-softmax copies, the KV cache of a generation, and the float64 statistics (d x d per
    gap and matrix, the influence criteria's Gram blocks through ``ghosted.selection.sums.gram_bytes``);
    the model's weights are shared by every job and not counted;
  * compute, in floating-point operations: 2 x parameters per layer x tokens for every layer a forward
    pass crosses (each variant an evaluation scores, each pass a criterion makes), plus the d³ solves of
    each fit.

``admit`` refuses a request over the deployment's per-job budget (``DeployConfig.max_job_gb``,
``max_job_tflop``) in one sentence naming the setting to lower and the largest value that fits (found by
bisection on the same estimate), so the message is exact for this model. The estimates are upper bounds,
checked against measured peaks in tests/unit/service/test_cost.py and bench/cost.py.

Example:
    >>> cost = estimate(wb.EvalRequest(eval_tokens=8192, eval_seq_len=2048), Shape.of(model))
    >>> round(cost.gb, 1), cost.parts["logits"]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ghosted.service import workbench as wb
from ghosted.service.deploy import DeployConfig, DeployRefusal

GB = 1e9  # budgets and messages in decimal gigabytes
TFLOP = 1e12
LOGIT_COPIES = {"evaluate": 6, "fit": 1, "influence": 2, "zeroshot": 6}  # B·T·V float32 tensors alive at once:
# the logits, their log-softmax, the reference's kept log-probabilities, the KL terms (measured: bench/cost.py)
STREAM_COPIES = 6  # B·T·d tensors alive in a layer: input, residual, norms, attention output, captures
FIT_MATRICES = 12  # float64 d x d matrices per gap: XᵀX, XᵀΔ, ΔᵀΔ, MᵀM, MᵀΔ for all and sink tokens, solves
STAT_STREAMS = 4  # float64 (B, T, d) copies a statistics update makes (x, y, Δ, m)
ZEROSHOT_TOKENS = 96  # tokens of one zero-shot example with its choices, at most (bundled task and harness)


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder-only model that set a job's cost."""

    layers: int
    width: int  # d, the residual stream
    ffn: int  # the feed-forward width
    vocab: int
    heads: int
    kv_width: int  # key/value heads x head size (the KV cache per token and layer is 2 of these)
    positions: int | None = None
    weight_bytes: int = 4  # bytes per weight and activation (float32 4, bfloat16 2)

    @classmethod
    def of_config(cls, config, weight_bytes: int = 4) -> Shape:
        """The shape in a transformers config (its text config for a multimodal one)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config

        def first(*names, default=None):
            return next((getattr(text, n) for n in names if getattr(text, n, None)), default)

        width = first("hidden_size", "n_embd", "d_model")
        heads = first("num_attention_heads", "n_head", default=1)
        head_dim = first("head_dim", default=width // heads)
        return cls(layers=first("num_hidden_layers", "n_layer"), width=width,
                   ffn=first("intermediate_size", "ffn_dim", "n_inner", default=4 * width),
                   vocab=first("vocab_size"), heads=heads,
                   kv_width=first("num_key_value_heads", default=heads) * head_dim,
                   positions=first("max_position_embeddings", "n_positions"), weight_bytes=weight_bytes)

    @classmethod
    def of(cls, model) -> Shape:
        """The shape of a loaded model: its config, its real layer count (a pruned model's too), its dtype."""
        from ghosted.models.architecture import num_layers

        shape = cls.of_config(model.config, next(model.parameters()).element_size())
        return replace(shape, layers=num_layers(model))

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer: attention (q, o and k, v) and a gated MLP (three matrices)."""
        return 2 * self.width * self.width + 2 * self.width * self.kv_width + 3 * self.width * self.ffn


@dataclass(frozen=True)
class Cost:
    """A job's estimated peak memory (by part, bytes) and compute (floating-point operations)."""

    kind: str
    parts: dict  # part -> bytes at the peak
    flop: float

    @property
    def bytes(self) -> int:
        return int(sum(self.parts.values()))

    @property
    def gb(self) -> float:
        return self.bytes / GB

    @property
    def tflop(self) -> float:
        return self.flop / TFLOP


def forward_bytes(shape: Shape, batch: int, window: int, logit_copies: int) -> dict:
    """The live set of one forward batch (B, T): streams, MLP, attention scores, logits."""
    tokens, act = batch * window, shape.weight_bytes
    return {"activations": tokens * (STREAM_COPIES * shape.width + 3 * shape.ffn) * act,
            "attention": 2 * batch * shape.heads * window * window * 4,  # scores and softmax, float32
            "logits": logit_copies * tokens * shape.vocab * 4}  # float32


def layer_flop(shape: Shape, tokens: int) -> float:
    """Operations of ``tokens`` through one decoder layer (2 per weight and token, plus attention)."""
    return 2.0 * tokens * shape.layer_params


def _gaps(fit: wb.FitRequest) -> int:
    """Operators a run fits per method: one per contiguous block, or one per layer (granularity layer)."""
    layers = sorted(set(fit.layers))
    if fit.granularity == "layer":
        return len(layers)
    return 1 + sum(1 for a, b in zip(layers, layers[1:]) if b != a + 1) if layers else 0


def fit_cost(fit: wb.FitRequest, shape: Shape) -> Cost:
    """Calibration passes (one, or one per gap in sequential mode), statistics per gap, a solve per fit."""
    gaps, windows = _gaps(fit), fit.calib_seqs + fit.heldout_seqs
    batch = min(fit.batch_size, windows)
    parts = forward_bytes(shape, batch, fit.seq_len, LOGIT_COPIES["fit"])
    parts["statistics"] = gaps * (FIT_MATRICES * shape.width ** 2 * 8 + STAT_STREAMS * batch * fit.seq_len
                                  * shape.width * 8)
    passes = gaps * len(fit.methods) if fit.ghost_mode == "sequential" else 1  # sequential: each method's
    # later gaps are calibrated through its own earlier fits
    fits = gaps * (len(fit.methods) + 1)
    flop = passes * shape.layers * layer_flop(shape, windows * fit.seq_len) + fits * 4.0 * shape.width ** 3
    return Cost("fit", parts, flop)


def influence_cost(request: wb.InfluenceRequest, shape: Shape) -> Cost:
    """One pass capturing every boundary, Gram blocks for the recoverability criteria, a pass per layer
    for the costly criteria."""
    from ghosted.selection.criteria import CRITERIA, RECOVERABILITY, block_list
    from ghosted.selection.sums import gram_bytes

    batch = min(4, request.calib_seqs)  # InfluenceConfig.batch_size
    parts = forward_bytes(shape, batch, request.seq_len, LOGIT_COPIES["influence"])
    parts["boundaries"] = 3 * batch * request.seq_len * (shape.layers + 1) * shape.width * 8  # (B, T, K, d)
    rec_n = [n for n in request.rec_n if 1 <= n < shape.layers]
    blocks = block_list(rec_n, shape.layers) if set(request.metrics) & RECOVERABILITY else []
    parts["statistics"] = gram_bytes(blocks, shape.width)
    per_layer = sum(1 for m in request.metrics if m in CRITERIA and CRITERIA[m].cost in ("per-layer", "gradient"))
    passes = 1 + (1 if request.heldout_seqs else 0) + per_layer * shape.layers
    tokens = (request.calib_seqs + request.heldout_seqs) * request.seq_len
    flop = passes * shape.layers * layer_flop(shape, tokens) + len(blocks) * 4.0 * shape.width ** 3
    return Cost("influence", parts, flop)


def eval_cost(request: wb.EvalRequest, shape: Shape) -> Cost:
    """Each variant (dense, pruned, every method) scores every window; logits dominate."""
    windows = max(1, request.eval_tokens // request.eval_seq_len)
    batch = min(request.fit.batch_size, windows)
    parts = forward_bytes(shape, batch, request.eval_seq_len, LOGIT_COPIES["evaluate"])
    variants = len(request.fit.methods) + 2
    flop = variants * shape.layers * layer_flop(shape, windows * request.eval_seq_len)
    return Cost("evaluate", parts, flop)


def generation_cost(request: wb.GenerationRequest, shape: Shape) -> Cost:
    """All prompts in one batch padded to the longest (at most a token per character), its KV cache."""
    prompts = len(request.prompts)
    longest = max((len(p) for p in request.prompts), default=0) + 32  # chat template and special tokens
    window = longest + request.new_tokens
    parts = forward_bytes(shape, prompts, longest, 0)
    parts["logits"] = prompts * shape.vocab * 4 * 2  # the last position's, and the processed scores
    parts["kv cache"] = 2 * shape.layers * prompts * window * shape.kv_width * shape.weight_bytes
    variants = len(request.fit.methods) + 2
    flop = variants * shape.layers * layer_flop(shape, prompts * window)
    return Cost("generate", parts, flop)


def zeroshot_cost(request: wb.ZeroShotRequest, shape: Shape) -> Cost:
    """Each variant scores ``task_limit`` examples of each task, one short batch at a time."""
    parts = forward_bytes(shape, 4, ZEROSHOT_TOKENS, LOGIT_COPIES["zeroshot"])
    tokens = len(request.tasks) * request.task_limit * ZEROSHOT_TOKENS
    flop = (len(request.fit.methods) + 2) * shape.layers * layer_flop(shape, tokens)
    return Cost("zeroshot", parts, flop)


def token_view_cost(request, shape: Shape) -> Cost:
    """The token view: a pass per variant over the first ``max_tokens`` tokens of one text."""
    parts = forward_bytes(shape, 1, request.max_tokens, LOGIT_COPIES["evaluate"])
    flop = (len(request.fit.methods) + 2) * shape.layers * layer_flop(shape, request.max_tokens)
    return Cost("token_losses", parts, flop)


def lens_cost(request, shape: Shape) -> Cost:
    """The logit lens: a pass per variant, every layer's stream read through the head (logits per layer)."""
    parts = forward_bytes(shape, 1, request.max_tokens, 2 * (shape.layers + 1))
    flop = (len(request.fit.methods) + 2) * (shape.layers * layer_flop(shape, request.max_tokens)
                                             + 2.0 * (shape.layers + 1) * request.max_tokens * shape.width
                                             * shape.vocab)
    return Cost("lens", parts, flop)


ESTIMATES = {"fit": fit_cost, "influence": influence_cost, "evaluate": eval_cost, "generate": generation_cost,
             "zeroshot": zeroshot_cost, "token_losses": token_view_cost, "lens": lens_cost}  # kind -> its estimate


def estimate(request, shape: Shape, refit: bool = True) -> Cost:
    """The cost of one job; a measurement on a fitted run that the store released also pays the fit again
    (``refit``: count that, as a queued measurement may have to)."""
    cost = ESTIMATES[request.kind](request, shape)
    fit = getattr(request, "fit", None)
    if fit is None or not refit:
        return cost
    refit = fit_cost(fit, shape)
    parts = {name: max(cost.parts.get(name, 0), refit.parts.get(name, 0)) for name in {*cost.parts, *refit.parts}}
    return Cost(cost.kind, parts, cost.flop + refit.flop)


# --- admission ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lever:
    """A setting a visitor can lower to make a job cheaper: how to read it, set it, and its least value."""

    label: str  # how the message names it (the form's words and the link's parameter)
    read: object  # request -> value
    write: object  # (request, value) -> request
    least: int = 1


def _fit_lever(label: str, name: str, least: int = 1) -> Lever:
    return Lever(label, lambda r: getattr(r, name), lambda r, v: replace(r, **{name: v}), least)


def _on_fit(lever: Lever) -> Lever:
    """The same lever on a measurement's run."""
    return Lever(lever.label, lambda r: lever.read(r.fit), lambda r, v: replace(r, fit=lever.write(r.fit, v)),
                 lever.least)


_METHODS = Lever("the number of methods (methods)", lambda r: len(r.methods),
                 lambda r, v: replace(r, methods=r.methods[:v]))
_FIT_LEVERS = (_METHODS, _fit_lever("the sequence length (seq_len)", "seq_len", 8),  # methods first: the
               _fit_lever("the batch (batch_size)", "batch_size"),  # compute of a run grows with them; its
               _fit_lever("the sequences (calib_seqs)", "calib_seqs"))  # memory does not (then seq_len is next)
LEVERS = {  # request kind -> its settings, the first to lower first
    "fit": _FIT_LEVERS,
    "influence": (_fit_lever("the sequence length (seq_len)", "seq_len", 8),
                  _fit_lever("the sequences (calib_seqs)", "calib_seqs")),
    "evaluate": (_fit_lever("the evaluation window (eval_seq_len)", "eval_seq_len", 16),
                 _fit_lever("the evaluation tokens (eval_tokens)", "eval_tokens", 64),
                 *(_on_fit(lever) for lever in _FIT_LEVERS[2:])),  # a run's batch and sequences
    "generate": (Lever("the number of prompts", lambda r: len(r.prompts),
                       lambda r, v: replace(r, prompts=r.prompts[:v])),
                 _fit_lever("the new tokens", "new_tokens")),
    "zeroshot": (_fit_lever("the examples per task (task_limit)", "task_limit"),),
    "token_losses": (_fit_lever("the tokens read (max_tokens)", "max_tokens", 2),),
    "lens": (_fit_lever("the tokens read (max_tokens)", "max_tokens", 2),),
}


def over_budget(cost: Cost, cfg: DeployConfig) -> str | None:
    """What of ``cost`` exceeds the deployment's per-job budget, in words, or None when it fits."""
    if cfg.max_job_gb is not None and cost.gb > cfg.max_job_gb:
        return f"about {cost.gb:,.1f} GB of memory ({_largest(cost)}), over the {cfg.max_job_gb:g} GB"
    if cfg.max_job_tflop is not None and cost.tflop > cfg.max_job_tflop:
        return f"about {cost.tflop:,.0f} TFLOP of compute, over the {cfg.max_job_tflop:g} TFLOP"
    return None


def _largest(cost: Cost) -> str:
    name, size = max(cost.parts.items(), key=lambda item: item[1])
    return f"{name} {size / GB:,.1f} GB"


def admit(request, lm, cfg: DeployConfig) -> Cost:
    """The one door to the queue: the request's deployment checks, the model-side checks the command line
    runs on the same spec (``request.validate``: layers within the model, windows within its positions),
    then its cost against the budget. Returns the cost; raises ``ValueError`` (``DeployRefusal``) else."""
    request.validate(lm)
    return check_budget(request, Shape.of(lm.model), cfg)


def check_budget(request, shape: Shape, cfg: DeployConfig) -> Cost:
    """The job's cost when it fits the deployment's per-job budget; else ``DeployRefusal`` in one sentence
    naming the setting to lower and the largest value of it that fits (the other settings as they are)."""
    cost = estimate(request, shape)
    excess = over_budget(cost, cfg)
    if excess is None:
        return cost
    what = "This " + {"fit": "run", "influence": "influence report", "evaluate": "evaluation",
                      "generate": "generation", "zeroshot": "zero-shot evaluation", "token_losses": "token view",
                      "lens": "lens"}[request.kind]
    for lever in LEVERS[request.kind]:
        value = _largest_fitting(request, lever, shape, cfg)
        if value is not None:
            raise DeployRefusal(f"{what} needs {excess} a job may use in the {cfg.name} deployment: lower "
                                f"{lever.label} from {lever.read(request):,} to {value:,} or less.")
    raise DeployRefusal(f"{what} needs {excess} a job may use in the {cfg.name} deployment, even at the least "
                        f"settings: choose fewer layers or methods, or a smaller model.")


def _largest_fitting(request, lever: Lever, shape: Shape, cfg: DeployConfig) -> int | None:
    """The largest value below the current one at which the request fits (bisection: costs only grow with a
    setting), or None when even the least value does not."""
    def fits(value: int) -> bool:
        try:
            return over_budget(estimate(lever.write(request, value), shape), cfg) is None
        except (ValueError, ZeroDivisionError):
            return False

    low, high = lever.least, lever.read(request) - 1
    if high < low or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low
