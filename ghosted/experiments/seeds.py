"""One experiment over several calibration draws: how much each method's perplexity moves with the windows.

An interval over evaluation windows says how precisely a perplexity is measured for one fit; it
says nothing about how the fit itself depends on which calibration windows were drawn. Rerunning
the experiment with ``seed, seed + 1, ..., seed + K - 1`` (the model is loaded once) and reporting
each method's mean and spread answers that second question.

Example:
    >>> report = run_seeds(spec, 3)            # report["seeds"]["summary"]: method -> mean, std, min, max
    >>> print(format_seeds(report))
"""

from __future__ import annotations

import statistics

from ghosted.core.progress import Progress, lines
from ghosted.experiments.spec import ExperimentSpec
from ghosted.models.loading import LoadedModel


def run_seeds(spec: ExperimentSpec, seeds: int, loaded: LoadedModel | None = None,
              progress: Progress | None = None, offload_folder: str | None = None) -> dict:
    """The first seed's full report, with ``"seeds"``: every seed's perplexities and, per method, their
    mean, standard deviation (n - 1), min and max. ``seeds`` < 1 is refused. Each draw's spec is checked
    once, by the session that runs it; the model is loaded once, by the first."""
    from ghosted.experiments.run import run_session
    from ghosted.experiments.session import Session

    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise ValueError(f"--seeds must be a whole number of calibration draws, at least 1; got {seeds!r}.")
    say = lines(progress)
    first, per_seed, lm = None, {}, loaded
    for i in range(seeds):
        seed = spec.calibration.seed + i
        say(f"calibration draw {i + 1} of {seeds} (seed {seed})")
        session = Session.open(spec.with_options(seed=seed), lm, progress, offload_folder=offload_folder)
        lm = session.lm
        report, _ = run_session(session)
        first = first or report
        per_seed[seed] = {e["method"]: e["ppl"] for e in report["results"]}
    first["seeds"] = {"perplexities": per_seed, "summary": summarize_seeds(per_seed)}
    return first


def summarize_seeds(per_seed: dict[int, dict[str, float]]) -> dict[str, dict]:
    """Per method: mean, std (n - 1; None for one seed), min and max of its perplexity over the seeds."""
    methods = list(dict.fromkeys(m for ppl in per_seed.values() for m in ppl))
    out = {}
    for method in methods:
        values = [ppl[method] for ppl in per_seed.values() if ppl.get(method) is not None]
        out[method] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
                       "min": min(values), "max": max(values), "seeds": len(values)}
    return out


def format_seeds(report: dict) -> str:
    """A table of each method's perplexity over the calibration draws (mean ± std, range)."""
    seeds = report.get("seeds")
    if not seeds:
        return ""
    draws = ", ".join(map(str, seeds["perplexities"]))
    head = f"{'method':<20}{'mean ppl':>12}{'± std':>10}{'min':>12}{'max':>12}"
    rows = [f"{m:<20}{s['mean']:>12.3f}{_std(s['std']):>10}{s['min']:>12.3f}{s['max']:>12.3f}"
            for m, s in seeds["summary"].items()]
    return "\n".join([f"over {len(seeds['perplexities'])} calibration draws (seeds {draws}):", head,
                      "-" * len(head), *rows])


def _std(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"
