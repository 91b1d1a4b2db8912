"""Check everything a user can get wrong before any work starts (``ghosted.experiments.plans`` then
describes the work for ``--dry-run``).

Two stages, so that a mistake costs seconds, not a calibration pass:

- *config-only* checks (``check_run``, ``check_grid``, ``check_export``, ``check_influence``) need no
  model: counts and sizes, ``eps``, seeds, method and criterion names, the syntax of a drop spec, the
  text sources and output paths. Front ends call them before loading the model.
- *model* checks (``check_run_model``, ...) need the layer count and the model's positions; they run
  right after loading and always before the first forward pass. ``model_facts``
  (``ghosted.experiments.facts``) reads the same facts from a model's config alone (no weights), which
  is what ``--dry-run`` uses for its plan.

Every check raises ``ValueError`` (a wrong value), ``TypeError`` (a wrong kind of value, e.g. a float
or a bool where a count or a layer index goes) or ``FileNotFoundError``, with a message that names the
setting both ways (``calib_seqs (--calib-seqs)``) so the API and the CLI say the same words.
"""

from __future__ import annotations

import math
import numbers
import os
from functools import cache
from pathlib import Path

from ghosted.experiments.facts import (  # noqa: F401 (re-exported: the checks' callers read the facts here)
    ModelFacts, facts_of_config, facts_of_model, is_whole_number, model_facts)
from ghosted.recovery.methods import BASELINE, RECOVERY, with_role

SEED_LIMIT = 2**32  # torch.Generator().manual_seed and numpy accept seeds in [0, 2**32)
# Bounds checked before anything is allocated (exact limits, such as the model's positions, come once it loads):
MAX_TOKENS = 2**27  # tokens in one calibration draw or one evaluation (134M; published protocols use < 1M)
MAX_WINDOW = 2**20  # tokens in one window (1M; no released model has more positions)
MAX_BATCH = 2**12  # windows in one forward batch
MAX_SEEDS = 100  # calibration draws of `run --seeds` (each one a whole run) and `grid --seeds` (a fit per cell)
COMMAND_FLAGS = {  # settings of a command that are not the experiment spec's (whose flags its fields carry)
    "seeds": "--seeds", "n_values": "--n-values", "candidate_windows": "--candidate-windows",
    "sleb_steps": "--sleb-steps", "max_gram_gib": "--max-gram-gib",
}


@cache
def _flags() -> dict[str, str]:
    """Flat name -> flag: the spec's, from its fields' metadata, and the commands' own."""
    from ghosted.experiments.spec import flat_flags

    return {**flat_flags(), **COMMAND_FLAGS}


def _label(name: str) -> str:
    """``calib_seqs (--calib-seqs)``: the setting's name (the API's and the spec's) and its CLI flag; a name
    that is no setting (an argument of ``ghosted.calibrate`` or ``ghosted.evaluate``) stands alone."""
    flag = _flags().get(name)
    return f"{name} ({flag})" if flag else name


def check_count(name: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    """A whole number in [``minimum``, ``maximum``] (TypeError for floats, bools and strings; ValueError outside)."""
    if not is_whole_number(value):
        raise TypeError(f"{_label(name)} must be a whole number, not {value!r} ({type(value).__name__}).")
    if value < minimum:
        raise ValueError(f"{_label(name)} must be at least {minimum}; got {value}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"{_label(name)} must be at most {maximum:,}; got {value:,}.")
    return int(value)


def check_eps(eps, name: str = "eps") -> float:
    """The ridge: a finite real number >= 0 (NaN or infinity would make every operator NaN)."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"{_label(name)} must be a number, not {eps!r} ({type(eps).__name__}).")
    if not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{_label(name)} must be a finite number >= 0 (e.g. 1e-6); got {eps}.")
    return float(eps)


def check_seed(seed) -> int:
    """A seed torch and numpy accept: 0 <= seed < 2**32."""
    check_count("seed", seed, minimum=0)
    if seed >= SEED_LIMIT:
        raise ValueError(f"{_label('seed')} must be below 2**32 = {SEED_LIMIT}; got {seed}.")
    return int(seed)


def check_draws(seed, seeds) -> int:
    """``seeds`` calibration draws from ``seed`` (seeds ``seed .. seed + seeds - 1``): 1 to MAX_SEEDS of them,
    the last one a seed torch accepts."""
    check_count("seeds", seeds, 1, MAX_SEEDS)
    if seed + seeds - 1 >= SEED_LIMIT:
        raise ValueError(f"{_label('seed')} + {_label('seeds')} - 1 must be below 2**32 = {SEED_LIMIT}; "
                         f"got {seed + seeds - 1}.")
    return int(seeds)


def check_windows(count_name: str, count, len_name: str, length, minimum_count: int = 1) -> None:
    """A window count (>= ``minimum_count``) and a window length (>= 2: one token predicts the next), their
    product within ``MAX_TOKENS``: checked before a window is drawn, so no size is spent unbounded."""
    check_count(count_name, count, minimum_count, MAX_TOKENS)
    check_count(len_name, length, 2, MAX_WINDOW)
    check_tokens(f"{_label(count_name)} x {_label(len_name)}", count * length)


def check_tokens(what: str, tokens: int) -> None:
    """A number of tokens to draw or score, at most ``MAX_TOKENS``."""
    if tokens > MAX_TOKENS:
        raise ValueError(f"{what} = {tokens:,} tokens is more than Ghosted draws at once ({MAX_TOKENS:,}); "
                         "use fewer or shorter windows.")


def check_eval_size(tokens, seq_len, tokens_name: str = "eval_tokens", len_name: str = "eval_seq_len") -> None:
    """Evaluation tokens that fill at least one window of ``seq_len``."""
    check_count(tokens_name, tokens, 1, MAX_TOKENS)
    check_count(len_name, seq_len, 2, MAX_WINDOW)
    if tokens < seq_len:
        raise ValueError(f"{_label(tokens_name)} = {tokens} is less than one window of {_label(len_name)} = "
                         f"{seq_len}: give at least {seq_len} tokens, or a shorter window.")


def check_methods(methods) -> list[str]:
    """A non-empty list of known method names, ``dense`` included (duplicates dropped, order kept)."""
    from ghosted.recovery.methods import REGISTRY

    if isinstance(methods, str):
        methods = [methods]
    names = [m.strip() if isinstance(m, str) else m for m in methods]
    known = list(REGISTRY)
    if not names or not all(names):
        raise ValueError(f"Give at least one method (--methods), from: {', '.join(known)}.")
    unknown = [m for m in names if m not in known]
    if unknown:
        raise ValueError(f"Unknown method(s) {unknown}; choose from {', '.join(known)}.")
    return list(dict.fromkeys(names))


def check_drop_syntax(spec) -> list[int]:
    """A drop spec read without the model (indices >= 0, ranges not backwards); the layer count is
    checked once the model (or its config) is known."""
    from ghosted.models.pruning import parse_layers

    return parse_layers(spec)


def check_drop(spec, n_layers: int) -> list[int]:
    """A drop spec within the model's layers that leaves at least one of them."""
    from ghosted.models.pruning import parse_layers

    return parse_layers(spec, n_layers)


def parse_counts(text: str, flag: str) -> list[int]:
    """A comma list of whole numbers from the command line ("7,11"), or a message naming the flag."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes whole numbers separated by commas, e.g. 7,11; got {text!r}.") from None


def check_n(n, n_layers: int | None, name: str = "n") -> int:
    """How many layers a criterion removes: 1 .. L-1."""
    check_count(name, n)
    if n_layers is not None and n > n_layers - 1:
        raise ValueError(f"{_label(name)} = {n} would remove every layer of this {n_layers}-layer model: "
                         f"at most {n_layers - 1}.")
    return int(n)


def check_positions(max_positions: int | None, **lengths: int) -> None:
    """Every window length within the model's positions (``max_position_embeddings``)."""
    if not max_positions:
        return
    for name, length in lengths.items():
        if length > max_positions:
            raise ValueError(f"{_label(name)} = {length} is longer than this model's {max_positions} "
                             f"positions (max_position_embeddings): use at most {max_positions}.")


def check_source(source, what: str = "text"):
    """A text source that can be read: bundled, a hub name, or an existing UTF-8 file (read now)."""
    from ghosted.data.sources import TextSource, resolve_source

    if not isinstance(source, (str, os.PathLike, TextSource)):
        raise TypeError(f"The {what} source must be a name or a path, not {type(source).__name__}.")
    return resolve_source(source)


def check_out_file(path, flag: str = "--out", overwrite: bool = False, model=None) -> None:
    """An output file path that can be written: not a folder, under a writable folder, never inside
    the model's folder (``model``: the --model argument) or a cache, and an existing file only if
    Ghosted wrote it or ``overwrite`` (checked before the model is loaded, so a typo never costs a
    model load)."""
    from ghosted.core.ownership import check_replace_file
    from ghosted.models.assets import check_can_create

    if not path:
        return
    target = Path(path).expanduser()
    if target.is_dir() or str(path).endswith(("/", "\\")):
        raise ValueError(f"{flag} {path} is a folder; name a file in it, e.g. {target / 'results.json'}.")
    check_can_create(target)
    check_replace_file(path, flag, overwrite, _protected(model))


def check_out_dir(path, flag: str = "--out-dir", overwrite: bool = False, model=None, names=()) -> None:
    """An output folder: absent (it will be created) or a folder, never an existing file, under a
    writable folder, never inside the model's folder or a cache; Ghosted's file ``names`` in it
    replaced only when Ghosted wrote them (its marker) or ``overwrite``."""
    from ghosted.core.ownership import check_write_into
    from ghosted.models.assets import check_can_create

    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a folder.")
    if not target.exists():
        check_can_create(target)
    check_write_into(path, flag, names, overwrite, _protected(model))


def _protected(model) -> list:
    """Folders no output goes into: the caches, and the model's own folder when ``model`` names one."""
    from ghosted.operators.targets import protected_folders

    return protected_folders(model) if model else protected_folders()


# ---- whole commands ----------------------------------------------------------------------------


def flat_settings(cfg):
    """The settings under the command line's flat names: an ``ExperimentSpec`` or ``GridConfig`` flattened
    (``.flat()``), anything else (parsed flags) as it is."""
    return cfg.flat() if hasattr(cfg, "flat") else cfg


def check_calibration(cfg, min_seqs: int = 1) -> None:
    """The calibration fields shared by an ExperimentSpec, a GridConfig and export: sizes, seed, batch, source."""
    cfg = flat_settings(cfg)
    check_windows("calib_seqs", cfg.calib_seqs, "seq_len", cfg.seq_len, min_seqs)
    check_count("heldout_seqs", cfg.heldout_seqs, 0, MAX_TOKENS)
    check_tokens(f"({_label('calib_seqs')} + {_label('heldout_seqs')}) x {_label('seq_len')}",
                 (cfg.calib_seqs + cfg.heldout_seqs) * cfg.seq_len)
    check_count("batch_size", cfg.batch_size, 1, MAX_BATCH)
    check_seed(cfg.seed)
    check_source(cfg.calib, "calibration")


def check_run(cfg) -> None:
    """Config-only checks of an ``ExperimentSpec`` (before the model is loaded)."""
    cfg = flat_settings(cfg)
    from ghosted.selection.criteria import resolve_criterion

    check_calibration(cfg)
    check_eval_size(cfg.eval_tokens, eval_window(cfg))
    check_source(cfg.eval, "evaluation")
    check_eps(cfg.eps)
    methods = check_methods(cfg.methods)
    if getattr(cfg, "rank", None) is not None:
        check_count("rank", cfg.rank)
    if cfg.select and cfg.drop:
        raise ValueError("Give either layers to drop (--drop) or a criterion to select them with (--select), "
                         "not both.")
    if cfg.select:
        resolve_criterion(cfg.select, iterative=True)
        check_n(cfg.n, None)
    else:
        drop = check_drop_syntax(cfg.drop)
        if not drop and with_role(methods, BASELINE, RECOVERY):
            raise ValueError("Methods other than 'dense' need layers to drop: give --drop (e.g. 20-26) or "
                             "--select with --n.")
    check_heldout(methods, cfg.heldout_seqs)


def check_run_model(cfg, facts: ModelFacts) -> list[int]:
    """Model checks of an ``ExperimentSpec``: the drop spec or n within the layers, windows within positions."""
    cfg = flat_settings(cfg)
    drop = []
    if facts.layers is not None and cfg.select:
        check_n(cfg.n, facts.layers)
    elif facts.layers is not None:
        drop = check_drop(cfg.drop, facts.layers)
    check_positions(facts.max_positions, seq_len=cfg.seq_len, eval_seq_len=eval_window(cfg))
    return drop


def eval_window(cfg) -> int:
    """The perplexity window a run or grid will use: its protocol preset's, else ``eval_seq_len``."""
    from ghosted.evaluation.protocols import PROTOCOLS

    preset = PROTOCOLS.get(getattr(cfg, "protocol", "") or "")
    return preset.seq_len if preset else cfg.eval_seq_len


def check_grid(cfg) -> None:
    """Config-only checks of a ``GridConfig``."""
    cfg = flat_settings(cfg)
    from ghosted.selection.criteria import resolve_criterion

    check_calibration(cfg)
    check_draws(cfg.seed, cfg.seeds)
    check_eval_size(cfg.eval_tokens, eval_window(cfg))
    if not cfg.selections:
        raise ValueError("Give at least one selection criterion (--selections).")
    for name in cfg.selections:
        resolve_criterion(name)
    if not cfg.n_values:
        raise ValueError("Give at least one number of layers to remove (--n).")
    for n in cfg.n_values:
        check_n(n, None)
    check_methods(cfg.methods)
    if not cfg.evals:
        raise ValueError("Give at least one evaluation text (--evals).")
    for source in cfg.evals:
        check_source(source, "evaluation")


def check_grid_model(cfg, facts: ModelFacts) -> None:
    """Model checks of a ``GridConfig``: every n removes fewer than all layers; windows within positions."""
    cfg = flat_settings(cfg)
    for n in cfg.n_values:
        check_n(n, facts.layers)
    check_positions(facts.max_positions, seq_len=cfg.seq_len, eval_seq_len=eval_window(cfg))


def check_export(spec) -> None:
    """Config-only checks of ``export``'s ``ExperimentSpec`` (one method): calibration, eps, the drop spec,
    ghost-auto's held-out windows. The output folder is checked by
    ``ghosted.operators.targets.check_target_folder`` (called first by the CLI)."""
    cfg = flat_settings(spec)
    check_calibration(cfg)
    check_eps(cfg.eps)
    if not check_drop_syntax(cfg.drop):
        raise ValueError("Give layers to drop (--drop), e.g. 20-26.")
    check_heldout(check_methods(cfg.methods), cfg.heldout_seqs)


def check_export_model(spec, facts: ModelFacts) -> list[int]:
    """Model checks of ``export``'s spec: the drop spec within the layers, the windows within positions."""
    cfg = flat_settings(spec)
    drop = check_drop(cfg.drop, facts.layers) if facts.layers else check_drop_syntax(cfg.drop)
    check_positions(facts.max_positions, seq_len=cfg.seq_len)
    return drop


def check_heldout(methods, heldout_seqs: int) -> None:
    """Refuse methods that choose on held-out calibration windows (the registry says which) without any."""
    from ghosted.recovery.methods import needing_heldout

    needs = needing_heldout(methods)
    if needs and heldout_seqs < 1:
        raise ValueError(f"{', '.join(needs)} chooses on held-out calibration windows: give some "
                         "(--heldout-seqs >= 1).")
