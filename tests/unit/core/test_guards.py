"""Numerical guards: broken fits stop or warn instead of looking like results.

Non-finite activations, statistics and operators raise an error naming the gap; a non-finite eps is
refused before any work; ill-conditioned fits warn with the tokens needed; windows with nothing to
score are an error; ghost-auto weighs "no operator" and is never worse than plain pruning on the
held-out windows it chooses on.
"""

import json
import os
import re
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest
import torch

import ghosted
from ghosted.models.architecture import layers_of
from ghosted.calibration.collect import Gap, require_finite_activations
from ghosted.evaluation.perplexity import perplexity
from ghosted.core.guards import MAX_CONDITION, IllConditionedFitWarning, NonFiniteError
from ghosted.recovery.fitting import RecoveryConfig, recover
from ghosted.recovery.robust import fit_robust
from ghosted.evaluation.shared_prefix import perplexities
from ghosted.recovery.solvers import condition_number, ghost_operator, replaceme_ls, warn_if_ill_conditioned
from ghosted.calibration.stats import BoundaryAccumulator
from tests.tiny import random_ids, tiny_model

WIDTH = 32  # residual width of tests.tiny models


def windows(n=6, t=24, seed=0):
    ids = random_ids(n, t, seed)
    return types.SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids), protocol={})


def stats_of(x: torch.Tensor, y: torch.Tensor, start=2, end=4, with_mlp=False):
    """Statistics of token rows (N, d) as one sequence."""
    acc = BoundaryAccumulator(start, end, x.shape[1], with_mlp=with_mlp)
    acc.update(x[None], y[None], torch.ones(1, x.shape[0], dtype=torch.bool), m=x[None] if with_mlp else None)
    return acc.finalize()


def synthetic(n=400, d=12, scales=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    scale = torch.logspace(0, 1, d, dtype=torch.float64) if scales is None else scales
    x = torch.randn(n, d, generator=gen, dtype=torch.float64) * scale  # (n, d)
    y = x @ (torch.eye(d, dtype=torch.float64) + 0.3 * torch.randn(d, d, generator=gen, dtype=torch.float64))
    return x, y


class NaNAfter:
    """Forward hook making one token of a layer's output NaN (a float16 overflow stand-in)."""

    def __init__(self, layer):
        self.handle = layer.register_forward_hook(self)

    def __call__(self, module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output
        hidden = hidden.clone()
        hidden[0, 3, 0] = float("nan")
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


def forward_counter(model):
    """A list that grows by one per forward pass of the model's first layer."""
    calls = []
    layers_of(model)[0].register_forward_pre_hook(lambda *a: calls.append(1))
    return calls


# --- non-finite activations, statistics, operators ---------------------------------------------

@pytest.mark.parametrize("dtype,cause", [(torch.float32, "in float32: check its weights"),
                                         (torch.float16, "range ends at 65504: load it in float32 or bfloat16")])
def test_nan_activations_stop_calibration_naming_the_gap_and_the_cause(dtype, cause):
    model = tiny_model("llama", layers=6).to(dtype)
    NaNAfter(layers_of(model)[1])  # the stream entering layer 2 (and everything after) holds a NaN
    calls = forward_counter(model)
    with pytest.raises(NonFiniteError) as caught:
        recover(model, "3-4", ["ghost"], windows(), windows(2, seed=1))
    message = str(caught.value)
    assert "[3, 5)" in message and cause in message
    assert "windows [0]" in message and len(calls) == 1  # stopped on the first batch
    assert isinstance(caught.value, ValueError)  # the CLI turns it into one line and exit code 2


def test_padding_positions_are_not_checked():
    """A NaN at a padding position is never accumulated, so it must not stop calibration."""
    x = torch.randn(2, 5, WIDTH)  # (B, T, d)
    valid = torch.ones(2, 5, dtype=torch.bool)
    x[1, 4, 7] = float("nan")
    valid[1, 4] = False
    require_finite_activations(Gap(3, 5), 0, valid, x, x + 1, None)
    valid[1, 4] = True
    with pytest.raises(NonFiniteError, match=r"gap \[3, 5\) \(1 tokens of calibration windows \[9\]"):
        require_finite_activations(Gap(3, 5), 8, valid, x, x + 1, None)


def test_non_finite_statistics_name_the_gap():
    x, y = synthetic()
    stats = stats_of(x, y, start=20, end=27)
    stats.xtd[0, 1] = float("inf")
    assert stats.nonfinite_fields() == ["XᵀΔ"]
    for fit in (lambda s: ghost_operator(s), lambda s: fit_robust(s, None), lambda s: ghost_operator(s, solver="pinv")):
        with pytest.raises(NonFiniteError, match=r"gap \[20, 27\).*XᵀΔ.*float16"):
            fit(stats)


def test_singular_solve_is_an_error_not_a_nan_operator():
    x, y = synthetic(n=40)
    x[:, 5] = 0.0  # a channel the calibration never excites: XᵀX is exactly singular
    with pytest.raises(ValueError, match=r"gap \[2, 4\).*singular.*eps > 0"):
        ghost_operator(stats_of(x, y), eps=0.0)
    assert torch.isfinite(ghost_operator(stats_of(x, y), eps=1e-6)).all()  # the ridge fixes it


def test_non_finite_logits_are_an_error_not_ppl_nan():
    model = tiny_model("llama", layers=4)
    NaNAfter(layers_of(model)[3])
    with pytest.raises(NonFiniteError, match="non-finite logits.*in float32: check its weights"):
        perplexity(model, windows(2), label="pruned")
    with pytest.raises(NonFiniteError, match="dense"):
        perplexities({"dense": model, "again": model}, windows(2))


# --- eps ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [float("nan"), float("inf"), -1e-6])
def test_the_solver_refuses_a_non_finite_or_negative_eps(eps):
    stats = stats_of(*synthetic())
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        ghost_operator(stats, eps=eps)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        fit_robust(stats, None, eps=eps)
    with pytest.raises(ValueError, match="ridge must be a finite number >= 0"):
        replaceme_ls(stats_of(*synthetic(), with_mlp=True), ridge=eps)


def test_eps_of_the_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match="eps must be a number"):
        ghost_operator(stats_of(*synthetic()), eps="1e-6")


def test_recover_refuses_nan_eps_before_any_forward_pass():
    model = tiny_model("llama", layers=6)
    calls = forward_counter(model)
    with pytest.raises(ValueError, match="nan"):
        recover(model, "2-3", ["ghost"], windows(), config=RecoveryConfig(eps=float("nan")))
    assert calls == []


# --- ill-conditioned fits -------------------------------------------------------------------------

def test_fewer_tokens_than_the_width_warn_with_the_tokens_needed():
    model = tiny_model("llama", layers=6)
    fit = windows(2, 8)  # 16 tokens for a 32-wide stream
    with pytest.warns(IllConditionedFitWarning) as caught:
        run = recover(model, "2-3", ["none", "ghost"], fit)
    message = str(caught[0].message)
    assert "[2, 4)" in message and "16 calibration tokens" in message and f"{WIDTH}-wide" in message
    assert f"at least {4 * WIDTH} calibration tokens" in message and "16 sequences of 8" in message
    assert run.warnings == [message]


def test_one_warning_per_gap_however_many_ghost_methods():
    model = tiny_model("llama", layers=6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = recover(model, "1,3", ["ghost", "ghost-robust", "ghost-auto"], windows(2, 8), windows(2, 8, seed=1))
    ours = [str(w.message) for w in caught if issubclass(w.category, IllConditionedFitWarning)]
    assert len(ours) == 2 and "[1, 2)" in ours[0] and "[3, 4)" in ours[1]
    assert run.warnings == ours
    assert not [w for w in caught if w.filename.endswith(("fitting.py", "solvers.py"))]  # points at the caller


def test_enough_tokens_do_not_warn():
    model = tiny_model("llama", layers=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedFitWarning)
        run = recover(model, "2-3", ["ghost", "replaceme-ls"], windows(8, 24))
    assert run.warnings == []


def test_plain_pruning_and_baselines_alone_do_not_check_conditioning():
    model = tiny_model("llama", layers=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedFitWarning)
        assert recover(model, "2-3", ["none", "linearpatch-diag"], windows(2, 8)).warnings == []


def test_a_huge_condition_number_warns_even_with_many_tokens():
    d = 12
    scales = torch.full((d,), 1e4, dtype=torch.float64)
    scales[-1] = 1e-3  # one channel barely excited: λ_max / λ_min ≈ 4e10 / 4e-4 ≈ 1e14
    x, y = synthetic(n=400, d=d, scales=scales)
    stats = stats_of(x, y)
    expected = np.linalg.cond((x.T @ x).numpy() + 1e-6 * np.eye(d))
    assert condition_number(stats, 1e-6) == pytest.approx(expected, rel=0.05)  # round-off at cond 1e14
    assert expected > MAX_CONDITION
    with pytest.warns(IllConditionedFitWarning, match=r"gap \[2, 4\).*condition number .*e\+1\d.*at least 48"):
        assert warn_if_ill_conditioned(stats, 1e-6) is not None


def test_a_well_conditioned_fit_does_not_warn():
    x, y = synthetic()
    stats = stats_of(x, y)
    assert condition_number(stats, 1e-6) == pytest.approx(np.linalg.cond((x.T @ x).numpy() + 1e-6 * np.eye(12)),
                                                          rel=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedFitWarning)
        assert warn_if_ill_conditioned(stats, 1e-6) is None


def test_the_warning_class_is_public():
    assert ghosted.IllConditionedFitWarning is IllConditionedFitWarning
    assert issubclass(IllConditionedFitWarning, UserWarning) and issubclass(ghosted.NonFiniteError, ValueError)


# --- windows with nothing to score ----------------------------------------------------------------

def test_all_padding_windows_are_an_error_not_perplexity_one():
    model = tiny_model("llama", layers=4)
    calls = forward_counter(model)
    w = windows(3, 16)
    w.attention_mask[:] = 0
    with pytest.raises(ValueError, match="No token would be scored in the 3 evaluation windows.*padding"):
        perplexity(model, w)
    with pytest.raises(ValueError, match="No token would be scored"):
        perplexities({"dense": model, "other": model}, w)
    assert calls == []  # refused before any forward pass


def test_windows_of_one_token_are_an_error():
    model = tiny_model("llama", layers=4)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        perplexity(model, windows(4, 1))


def test_partly_padded_windows_still_score():
    model = tiny_model("llama", layers=4)
    w = windows(2, 16)
    w.attention_mask[0] = 0  # one window is all padding, the other scores 15 targets
    assert perplexity(model, w).scored_tokens == 15


# --- ghost-auto weighs "no operator" --------------------------------------------------------------

def heldout_nll(model, held):
    return perplexity(model, held).nll


def test_ghost_auto_chooses_no_operator_when_that_is_best_on_held_out():
    """A tiny llama whose paper and robust fits both make the held-out windows worse."""
    model = tiny_model("llama", layers=6, seed=2)
    fit, held = windows(8, 16, seed=2), windows(4, 16, seed=102)
    run = recover(model, "2-3", ["none", "ghost", "ghost-robust", "ghost-auto"], fit, held)
    choice = run.choices().query("method == 'ghost-auto'").iloc[0]
    nll = {name: heldout_nll(run.results[name].model, held) for name in ("none", "ghost", "ghost-robust")}
    assert nll["none"] < min(nll["ghost"], nll["ghost-robust"])  # the premise, computed independently
    assert choice.chosen == "none" and "no operator" in choice.reason
    assert choice.nll_none == pytest.approx(nll["none"], abs=1e-9)
    assert choice.nll_paper == pytest.approx(nll["ghost"], abs=1e-9)
    auto = run.results["ghost-auto"]
    assert auto.operators == {} and auto.fits == {}
    ids = held.input_ids
    torch.testing.assert_close(auto.model(ids).logits, run.results["none"].model(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("family,seed,drop", [("llama", 0, "2-3"), ("gpt2", 2, "2-4"), ("llama", 3, "0-1"),
                                              ("llama", 2, "2-3"), ("llama", 2, "1,3"), ("qwen2", 0, "1,3-4")])
def test_ghost_auto_is_never_worse_than_plain_pruning_on_held_out(family, seed, drop):
    model = tiny_model(family, layers=6, seed=seed)
    fit, held = windows(2, 12, seed=seed), windows(3, 16, seed=50 + seed)  # few tokens: overfitting is likely
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IllConditionedFitWarning)
        run = recover(model, drop, ["none", "ghost", "ghost-auto"], fit, held)
    auto, none, paper = (heldout_nll(run.results[m].model, held) for m in ("ghost-auto", "none", "ghost"))
    assert auto <= none + 1e-9  # never worse than no recovery on the held-out windows
    if auto > paper + 1e-9:  # the paper's fit predicts them better, but not significantly: the simpler stays
        reasons = " ".join(run.choices().query("method == 'ghost-auto'").reason)
        assert "too little held-out text" in reasons or "not significant" in reasons, reasons
    assert set(run.choices().query("method == 'ghost-auto'").chosen) <= {"paper", "robust", "none"}


# --- the command line -------------------------------------------------------------------------------

@pytest.mark.slow
def test_cli_prints_the_ill_conditioned_warning_once_per_gap(tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "ghosted", "run", "--drop", "20-22", "--methods", "none,ghost,ghost-auto",
           "--calib-seqs", "2", "--seq-len", "32", "--heldout-seqs", "1", "--eval-tokens", "256",
           "--eval-seq-len", "128", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("IllConditionedFitWarning") == 1
    assert "gap [20, 23): only 64 calibration tokens for a 576-wide stream" in proc.stderr
    assert "at least 2,304 calibration tokens" in proc.stderr
    report = json.loads(out.read_text())
    assert len(report["warnings"]) == 1 and "[20, 23)" in report["warnings"][0]
    auto = next(e for e in report["results"] if e["method"] == "ghost-auto")
    assert re.fullmatch(r"20-22: paper \d+\.\d{4}, robust \d+\.\d{4}, none \d+\.\d{4}", auto["auto_heldout_nll"])
    assert auto["chosen"].split(": ")[1] in {"paper", "robust", "none"}
    assert f"ghost-auto chose {auto['chosen']} (held-out NLL 20-22: paper" in proc.stdout


@pytest.mark.slow
def test_cli_refuses_nan_eps(capsys, bundled):
    from ghosted.cli import main

    code = main(["run", "--drop", "20-22", "--methods", "none,ghost", "--eps", "nan", "--eval-tokens", "512"])
    assert code == 2
    assert "eps" in capsys.readouterr().err
