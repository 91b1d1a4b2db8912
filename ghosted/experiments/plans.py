"""What a command would do, in words, with an estimate of its forward passes (``--dry-run``).

Every plan first runs the model checks of ``ghosted.experiments.validate`` against the facts read from the
model's config (``ghosted.experiments.facts``), so a dry run refuses what the real run would refuse.
"""

from __future__ import annotations

from ghosted.experiments.facts import ModelFacts
from ghosted.experiments.validate import (
    check_export_model, check_grid_model, check_methods, check_run_model, flat_settings)
from ghosted.recovery.methods import BASELINE, RECOVERY, with_role


def _batches(windows: int, batch_size: int) -> int:
    return -(-windows // batch_size)


def _facts_line(model: str, facts: ModelFacts) -> str:
    if facts.layers is None:
        return f"model: {model} ({facts.note})"
    width = f", width {facts.hidden_size}" if facts.hidden_size else ""
    positions = f", {facts.max_positions} positions" if facts.max_positions else ""
    return f"model: {model} ({facts.layers} layers{width}{positions})"


def _calibration_line(cfg) -> str:
    total = cfg.calib_seqs + cfg.heldout_seqs
    return (f"calibration: {cfg.calib}, {cfg.calib_seqs} x {cfg.seq_len} tokens fitted + {cfg.heldout_seqs} "
            f"held-out windows, seed {cfg.seed}: {total} windows, {_batches(total, cfg.batch_size)} batches "
            f"of {cfg.batch_size} per pass")


def _evaluation_line(source: str, calib: str, tokens: int, seq_len: int) -> str:
    from ghosted.data.windows import evaluation_part

    part = evaluation_part(source, calib)
    where = "the whole text" if part == "whole" else f"{part} part"
    return (f"evaluation: {source} ({where}), {tokens // seq_len} windows of {seq_len} tokens "
            f"({tokens // seq_len * seq_len} tokens)")


def plan_run(cfg, facts: ModelFacts) -> str:
    """What ``run`` would do, in words, with an estimate of its forward passes (``--dry-run``)."""
    cfg = flat_settings(cfg)
    from ghosted.selection.criteria import resolve_criterion
    from ghosted.models.pruning import format_layers

    drop = check_run_model(cfg, facts)
    methods = check_methods(cfg.methods)
    fitted = with_role(methods, BASELINE, RECOVERY)
    if cfg.select:
        layers = f"chosen by {resolve_criterion(cfg.select, iterative=True)} (n = {cfg.n}) on the calibration windows"
    else:
        layers = format_layers(drop) or "none"
    calib_batches = _batches(cfg.calib_seqs + cfg.heldout_seqs, cfg.batch_size)
    eval_batches = _batches(cfg.eval_tokens // cfg.eval_seq_len, cfg.batch_size)
    passes = (calib_batches if fitted else 0) * (1 + bool(cfg.select)) + eval_batches * len(methods)
    lines = [_facts_line(cfg.model, facts), f"layers to drop: {layers}",
             _calibration_line(cfg) if fitted or cfg.select else "calibration: none (dense only)",
             _evaluation_line(cfg.eval, cfg.calib, cfg.eval_tokens, cfg.eval_seq_len) if not cfg.protocol
             else _protocol_line(cfg.protocol),
             _tasks_line(cfg),
             f"methods: {', '.join(methods)} ({cfg.ghost_mode}, granularity {cfg.granularity}, eps {cfg.eps}, "
             f"solver {cfg.solver})",
             f"estimated forward passes: about {passes} batches ({calib_batches} per calibration pass"
             f"{', one more to select the layers' if cfg.select else ''}; {eval_batches} per evaluated model; "
             "sequential mode and ghost-auto's held-out choice add a few)",
             *(_layerwise_lines(cfg, facts, drop, methods, fitted) if getattr(cfg, "layerwise", False) else [])]
    return "\n".join(["dry run: nothing is loaded or computed", *lines])


def _layerwise_lines(cfg, facts: ModelFacts, drop: list[int], methods: list[str], fitted: list[str]) -> list[str]:
    """The layer-wise memory plan (``--layerwise``): per pass, bytes read, groups, peak, time to read."""
    from ghosted.calibration.collect import gaps_of
    from ghosted.evaluation.layerwise import LOGITS_BUDGET
    from ghosted.models import memory_plan
    from ghosted.models.loading import resolve_device, resolve_dtype

    if facts.layers is None or facts.hidden_size is None:
        return [f"layer-wise memory plan: not available ({facts.note or 'the config gives no layer count or width'})"]
    device = resolve_device(cfg.device)
    gaps = len(gaps_of(drop)) if drop else 1
    passes = [("calibration", cfg.calib_seqs, cfg.seq_len, 2 + 2 * gaps)] if fitted or cfg.select else []
    if (fitted or cfg.select) and cfg.heldout_seqs:
        passes.append(("held-out statistics", cfg.heldout_seqs, cfg.seq_len, 2 + 2 * gaps))
    if not cfg.protocol:
        passes.append((f"perplexity x{len(methods)}", cfg.eval_tokens // cfg.eval_seq_len, cfg.eval_seq_len,
                       len(methods)))
    return memory_plan.describe(cfg.model, facts.layers, facts.hidden_size, passes, cfg.batch_size,
                                resolve_dtype(cfg.dtype, device), device, LOGITS_BUDGET)


def _protocol_line(name: str) -> str:
    from ghosted.evaluation.protocols import PROTOCOLS

    return f"evaluation: the {name} protocol: {PROTOCOLS[name].note}"


def _tasks_line(cfg) -> str:
    if not cfg.tasks:
        return "zero-shot tasks: none (--tasks)"
    limit = "every example" if cfg.task_limit is None else f"{cfg.task_limit} examples each"
    return f"zero-shot tasks: {', '.join(cfg.tasks)} ({limit}, {cfg.num_fewshot}-shot)"


def plan_grid(cfg, facts: ModelFacts) -> str:
    """What ``grid`` would do (``--dry-run``)."""
    cfg = flat_settings(cfg)
    from ghosted.selection.criteria import resolve_criterion

    check_grid_model(cfg, facts)
    settings = len(cfg.selections) * len(cfg.n_values)
    calib_batches = _batches(cfg.calib_seqs + cfg.heldout_seqs, cfg.batch_size)
    eval_batches = _batches(cfg.eval_tokens // cfg.eval_seq_len, cfg.batch_size)
    methods = check_methods(cfg.methods)
    fits = settings * cfg.seeds  # every cell on every calibration draw
    passes = calib_batches * (1 + fits) + eval_batches * len(cfg.evals) * len(methods) * fits
    lines = [_facts_line(cfg.model, facts),
             f"selections: {', '.join(f'{s} (= {resolve_criterion(s)})' for s in cfg.selections)}; "
             f"n = {', '.join(map(str, cfg.n_values))}: {settings} settings",
             _calibration_line(cfg),
             *([f"calibration draws: {cfg.seeds} (seeds {cfg.seed}..{cfg.seed + cfg.seeds - 1}), every cell fitted "
                "on each, the layers chosen on the first"] if cfg.seeds > 1 else []),
             *([_evaluation_line(s, cfg.calib, cfg.eval_tokens, cfg.eval_seq_len) for s in cfg.evals]
               if not cfg.protocol else [_protocol_line(cfg.protocol)]),
             _tasks_line(cfg),
             f"methods: {', '.join(methods)}",
             f"estimated forward passes: at most about {passes} batches (one influence pass, one calibration "
             "pass per distinct layer set and draw, each model on each text; shared prefixes make it fewer)"]
    return "\n".join(["dry run: nothing is loaded or computed", *lines])


def plan_export(spec, facts: ModelFacts, out: str) -> str:
    """What ``export`` would do with ``spec`` (one method) into folder ``out`` (``--dry-run``)."""
    from ghosted.models.pruning import format_layers

    drop = check_export_model(spec, facts)
    cfg = flat_settings(spec)
    lines = [_facts_line(cfg.model, facts), f"layers to drop: {format_layers(drop)}", _calibration_line(cfg),
             f"method: {', '.join(cfg.methods)} ({cfg.ghost_mode}, granularity {cfg.granularity}, eps {cfg.eps})",
             f"output folder: {out}",
             f"estimated forward passes: about {_batches(cfg.calib_seqs + cfg.heldout_seqs, cfg.batch_size)} "
             "batches (one calibration pass)"]
    return "\n".join(["dry run: nothing is loaded, computed or written", *lines])


def plan_influence(spec, metrics: list[str], n_values: str, out_dir: str, facts: ModelFacts) -> str:
    """What ``influence`` would do (``--dry-run``): ``spec`` gives the model and the calibration windows,
    ``n_values`` the block sizes as given (``"all"`` or a list)."""
    cfg = spec.flat()
    lines = [_facts_line(cfg.model, facts), _calibration_line(cfg), f"criteria: {', '.join(metrics)}",
             f"block sizes n: {n_values}; output folder: {out_dir}",
             f"estimated forward passes: {_batches(cfg.calib_seqs, cfg.batch_size)} batches for the shared pass, "
             "more for ppl_single and sleb (one pass per candidate layer) and taylor (one backward pass)"]
    return "\n".join(["dry run: nothing is loaded or computed", *lines])
