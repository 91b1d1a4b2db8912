"""The whole experiment in one call: load, calibrate, fit each method, evaluate, report.

Used by the CLI (``python -m ghosted run``), the reproduction grid and the app, so that all three
produce the same numbers under the same protocol.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from ghosted import __version__
from ghosted.assets import BUNDLED_MODEL
from ghosted.calibration import CalibrationConfig
from ghosted.loading import LoadedModel, load_model
from ghosted.pruning import format_layers, parse_layers
from ghosted.recover import RecoveryConfig, RecoveryRun, recover
from ghosted.shared_eval import perplexities
from ghosted.text import TokenWindows, calibration_windows, evaluation_windows

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class RunConfig:
    """One experiment. Defaults are the paper's protocol scaled down for a CPU."""

    model: str = BUNDLED_MODEL  # bundled model, local folder, .gguf file or hub id
    calib: str = "bundled:news"  # calibration text (paper: C4 train)
    eval: str = "bundled:wiki"  # evaluation text (paper: WikiText-2 test, PTB, C4)
    calib_seqs: int = 32  # calibration sequences (paper: 32 for the ghost operator)
    seq_len: int = 256  # calibration sequence length (paper: 2048)
    heldout_seqs: int = 8  # extra calibration windows, never fitted, for held-out boundary errors
    eval_tokens: int = 16384  # tokens of evaluation text (paper: the whole test split)
    eval_seq_len: int = 512  # perplexity window (paper: 2048)
    device: str = "auto"  # cuda > mps > cpu
    dtype: str = "auto"  # bfloat16 on GPU, float32 on CPU
    seed: int = 0  # which calibration windows are drawn
    drop: str = ""  # layers to remove, 0-based, e.g. "20-26" or "3,7,9-11"
    select: str = ""  # or: choose the layers by this influence criterion (ghosted.layer_influence.CRITERIA)
    n: int = 0  # how many layers ``select`` removes
    methods: list[str] = field(default_factory=lambda: ["dense", "none", "ghost-auto"])  # ghost-auto: the
    # paper's fit or the sink-robust one per gap, never worse than the paper's on the reproduction grid
    ghost_mode: str = "independent"  # or "sequential"
    granularity: str = "auto"  # operator per contiguous block or per removed layer
    eps: float = 1e-6  # ghost ridge
    solver: str = "solve"  # "solve" or "pinv"
    batch_size: int = 4  # windows per forward pass
    rank: int | None = None  # ghost-lowrank's rank R (None: d/4)

    def recovery_config(self) -> RecoveryConfig:
        return RecoveryConfig(eps=self.eps, solver=self.solver, mode=self.ghost_mode, rank=self.rank,
                              granularity=self.granularity,
                              calibration=CalibrationConfig(batch_size=self.batch_size, seed=self.seed))


def split_calibration(windows: TokenWindows, heldout: int) -> tuple[TokenWindows, TokenWindows | None]:
    """The first windows fit, the last ``heldout`` are kept for held-out errors (disjoint slots)."""
    if heldout <= 0:
        return windows, None
    n = windows.input_ids.size(0) - heldout
    proto = dict(windows.protocol)

    def part(sl, name, count):
        return TokenWindows(windows.input_ids[sl], windows.attention_mask[sl],
                            {**proto, "n_windows": count, "role": name,
                             "tokens": count * windows.input_ids.size(1),
                             "scored_tokens": count * (windows.input_ids.size(1) - 1)})
    return part(slice(0, n), "fit", n), part(slice(n, None), "held-out", heldout)


def versions() -> dict:
    import transformers

    return {"ghosted": __version__, "transformers": transformers.__version__,
            "torch": torch.__version__, "python": platform.python_version()}


def run_experiment(cfg: RunConfig, loaded: LoadedModel | None = None,
                   progress: Progress | None = None, show_tqdm: bool = True) -> tuple[dict, RecoveryRun | None]:
    """Run ``cfg`` and return (a JSON-ready report, the RecoveryRun with the recovered models)."""
    started = time.perf_counter()
    lm = loaded or load_model(cfg.model, device=cfg.device, dtype=cfg.dtype)
    from ghosted.arch import num_layers

    dropped, selection = _layers_to_drop(cfg, lm)
    methods = list(dict.fromkeys(cfg.methods))
    eval_windows = evaluation_windows(lm.tokenizer, cfg.eval, cfg.eval_tokens, cfg.eval_seq_len)
    run, calib_proto = None, None
    recovery_methods = [m for m in methods if m != "dense"]
    if recovery_methods:
        if not dropped:
            raise ValueError("Methods other than 'dense' need layers to drop (--drop).")
        calib = calibration_windows(lm.tokenizer, cfg.calib, cfg.calib_seqs + cfg.heldout_seqs,
                                    cfg.seq_len, cfg.seed)
        fit, held = split_calibration(calib, cfg.heldout_seqs)
        calib_proto = fit.protocol
        run = recover(lm.model, dropped, recovery_methods, fit, held, cfg.recovery_config(),
                      progress=progress, show_tqdm=show_tqdm)
    models = {"dense": lm.model} if "dense" in methods else {}
    models.update({name: r.model for name, r in (run.results.items() if run else [])})
    errors = run.errors() if run else None
    step = (lambda done, total: progress("perplexity", done, total)) if progress else None
    results = perplexities(models, eval_windows, batch_size=cfg.batch_size, progress=step,
                           show_tqdm=show_tqdm)  # leading layers shared by all variants run once
    entries = [result_entry(name, results[name], run, errors, model) for name, model in models.items()]
    report = {
        "model": lm.name, "model_source": lm.source, "dropped": dropped,
        "dropped_spec": format_layers(dropped), "layers": num_layers(lm.model), "selection": selection,
        "config": asdict(cfg), "protocol": {"evaluation": entries[0]["protocol"] if entries else {},
                                            "calibration": calib_proto},
        "results": [{k: v for k, v in e.items() if k != "protocol"} for e in entries],
        "versions": versions(), "seconds": round(time.perf_counter() - started, 2),
    }
    return report, run


def _layers_to_drop(cfg: RunConfig, lm: LoadedModel) -> tuple[list[int], dict | None]:
    """``cfg.drop`` parsed, or the layers ``cfg.select`` chooses on the calibration windows (and why)."""
    from ghosted.arch import num_layers

    if not cfg.select:
        return parse_layers(cfg.drop, num_layers(lm.model)), None
    if cfg.drop:
        raise ValueError("Give either layers to drop or a criterion to select them with, not both.")
    from ghosted.layer_influence import InfluenceConfig
    from ghosted.selection import select

    calib = calibration_windows(lm.tokenizer, cfg.calib, cfg.calib_seqs + cfg.heldout_seqs, cfg.seq_len, cfg.seed)
    fit, held = split_calibration(calib, cfg.heldout_seqs)
    started = time.perf_counter()
    layers, reason = select(lm.model, cfg.select, cfg.n, windows=fit, heldout=held,
                            config=InfluenceConfig(batch_size=cfg.batch_size, eps=cfg.eps, solver=cfg.solver))
    return layers, {"metric": cfg.select, "n": cfg.n, "layers": layers, "reason": reason,
                    "seconds": round(time.perf_counter() - started, 2)}


def result_entry(name: str, res, run: RecoveryRun | None, errors, model) -> dict:
    """One model's report entry: perplexity, timing, parameters and, for a recovered model, its fit."""
    entry = {"method": name, "ppl": res.ppl, "nll": res.nll, "eval_seconds": round(res.seconds, 2),
             "parameters": sum(p.numel() for p in model.parameters()), "protocol": res.protocol}
    if run and name in run.results:
        r = run.results[name]
        entry["calib_seconds"] = round(r.calib_seconds, 3)
        entry["solve_seconds"] = round(r.solve_seconds, 4)
        label = "pruned" if name == "none" else name
        chosen = [f"{c['boundary']}: {c['chosen']}" for c in r.choices if "chosen" in c]
        if chosen:  # ghost-auto: which fit each gap got
            entry["chosen"] = ", ".join(chosen)
        for split in ("fit", "heldout"):
            rows = errors[(errors.method == label) & (errors.split == split)]
            if len(rows):  # token-weighted over gaps: total error / total ‖Δ‖²
                total_delta = (rows.error / rows.relative_error).sum()
                entry[f"{split}_boundary_error"] = float(rows.error.sum() / total_delta)
    return entry


def format_table(report: dict) -> str:
    """A plain-text table of the report's results, with the protocol underneath."""
    head = f"{'method':<20}{'ppl':>12}{'held-out err':>14}{'calib s':>10}{'solve s':>10}{'params':>14}"
    lines = [head, "-" * len(head)]
    for e in report["results"]:
        err = e.get("heldout_boundary_error")
        lines.append(f"{e['method']:<20}{e['ppl']:>12.3f}{'' if err is None else f'{err:.4f}':>14}"
                     f"{e.get('calib_seconds', ''):>10}{e.get('solve_seconds', ''):>10}{e['parameters']:>14,}")
    ev = report["protocol"]["evaluation"]
    lines.append(f"model {report['model']}; dropped {report['dropped_spec'] or 'none'} of {report['layers']} layers")
    if report.get("selection"):
        lines.append(f"selected by {report['selection']['reason']}")
    lines.append(f"evaluation: {ev.get('source')} ({ev.get('part')}), {ev.get('scored_tokens')} tokens scored in "
                 f"{ev.get('n_windows')} windows of {ev.get('seq_len')}, BOS {ev.get('bos')}, "
                 f"{ev.get('dtype')} on {ev.get('device')}")
    cal = report["protocol"]["calibration"]
    if cal:
        lines.append(f"calibration: {cal.get('source')} ({cal.get('part')}), {cal.get('n_windows')} x "
                     f"{cal.get('seq_len')} tokens, seed {cal.get('seed')}")
    return "\n".join(lines)
