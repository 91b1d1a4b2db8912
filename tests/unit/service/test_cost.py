"""The cost model: estimates from a model's shape, the one door before the queue, and the estimates against
measured peaks of resident memory (never below the measure by more than ``bench.cost.MARGIN_MIB``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.cost import MARGIN_MIB, map_large_blocks, real_shaped
from ghosted.service import workbench as wb
from ghosted.service.cost import LEVERS, Shape, admit, check_budget, estimate
from ghosted.service.deploy import CLASSROOM, DEMO, LOCAL, DeployRefusal
from tests.properties import examples
from tests.tiny import tiny_loaded

SMOLLM2 = Shape(layers=30, width=576, ffn=1536, vocab=49152, heads=9, kv_width=192, positions=8192)  # the bundled
FIT = wb.FitRequest(layers=(20, 21))
MIB = 2**20


def test_the_link_with_windows_beyond_the_positions_is_refused_before_the_queue():
    lm = tiny_loaded(layers=6)  # 128 positions
    fit = wb.FitRequest(model="tiny", layers=(2, 3))
    evaluation = wb.EvalRequest(fit=fit, eval_tokens=1024, eval_seq_len=512)
    with pytest.raises(ValueError, match=r"eval_seq_len \(--eval-seq-len\) = 512 is longer than this model's 128"):
        admit(evaluation, lm, LOCAL)
    with pytest.raises(ValueError, match="longer than this model's 128"):
        admit(wb.FitRequest(model="tiny", layers=(2, 3), seq_len=256), lm, LOCAL)
    with pytest.raises(ValueError, match="drops all|not valid|out of range|layers"):
        admit(wb.FitRequest(model="tiny", layers=(2, 30)), lm, LOCAL)
    assert admit(wb.EvalRequest(fit=fit, eval_tokens=256, eval_seq_len=64), lm, DEMO).bytes > 0


def test_logits_grow_with_the_window_and_the_demo_refuses_naming_the_setting_and_the_largest_value_that_fits():
    small = estimate(wb.EvalRequest(fit=FIT, eval_tokens=8192, eval_seq_len=512), SMOLLM2)
    large = estimate(wb.EvalRequest(fit=FIT, eval_tokens=8192, eval_seq_len=2048), SMOLLM2)
    assert large.parts["logits"] == 4 * small.parts["logits"] and large.bytes > 3 * small.bytes
    check_budget(wb.EvalRequest(fit=FIT, eval_tokens=8192, eval_seq_len=512), SMOLLM2, DEMO)  # the defaults' size
    with pytest.raises(DeployRefusal) as refused:
        check_budget(wb.EvalRequest(fit=FIT, eval_tokens=8192, eval_seq_len=2048), SMOLLM2, DEMO)
    message = str(refused.value)
    assert "4 GB" in message and "lower the evaluation window (eval_seq_len) from 2,048 to " in message
    value = int(message.rsplit(" to ", 1)[1].split()[0].replace(",", ""))
    check_budget(wb.EvalRequest(fit=FIT, eval_tokens=8192, eval_seq_len=value), SMOLLM2, DEMO)  # it fits
    with pytest.raises(DeployRefusal):  # and it is the largest that does
        check_budget(wb.EvalRequest(fit=FIT, eval_tokens=8192, eval_seq_len=value + 1), SMOLLM2, DEMO)


def test_a_run_of_many_gaps_in_sequential_mode_with_every_method_is_refused_for_its_compute():
    from ghosted.recovery.fitting import METHODS
    from ghosted.recovery.methods import RECOVERY, with_role

    every = tuple(with_role(METHODS, RECOVERY))
    fit = wb.FitRequest(layers=tuple(range(0, 28, 2)), ghost_mode="sequential", methods=every)  # 14 gaps
    with pytest.raises(DeployRefusal, match=r"TFLOP of compute.*the number of methods \(methods\) from \d+ to 1 or"):
        check_budget(fit, SMOLLM2, DEMO)
    check_budget(wb.FitRequest(layers=tuple(range(20, 26))), SMOLLM2, DEMO)  # the page's default run
    check_budget(fit, SMOLLM2, LOCAL)  # a workstation has no budget


def test_the_page_defaults_fit_every_budget():
    for cfg in (DEMO, CLASSROOM):
        for request in (wb.InfluenceRequest(), FIT, wb.EvalRequest(fit=FIT), wb.ZeroShotRequest(fit=FIT),
                        wb.GenerationRequest(fit=FIT, prompts=("The capital of France is",) * 3)):
            check_budget(request, SMOLLM2, cfg)


def test_every_request_the_app_queues_has_an_estimate_and_a_setting_to_lower():
    from ghosted.service import probes

    requests = [wb.InfluenceRequest(), FIT, wb.EvalRequest(fit=FIT), wb.ZeroShotRequest(fit=FIT),
                wb.GenerationRequest(fit=FIT, prompts=("a",)), probes.TokenLossRequest(fit=FIT, passage="a b c"),
                probes.LensRequest(fit=FIT, prompt="a b c")]
    kinds = {cls.kind for module in (wb, probes) for cls in vars(module).values()
             if isinstance(cls, type) and issubclass(cls, wb._Request) and cls.kind}
    assert kinds == {r.kind for r in requests} and kinds <= set(LEVERS)
    for request in requests:
        assert estimate(request, SMOLLM2).bytes > 0
        check_budget(request, SMOLLM2, DEMO)  # each page's default fits the demo


def test_generation_prompts_are_bounded_in_count_and_characters():
    with pytest.raises(DeployRefusal, match="500 prompts.*at most 8"):
        wb.GenerationRequest(prompts=("x" * 27_600,) * 500).check(DEMO)
    with pytest.raises(DeployRefusal, match="10,485,760 characters.*at most 2,000"):
        wb.GenerationRequest(prompts=("x" * 10 * MIB,)).check(DEMO)
    wb.GenerationRequest(prompts=("x" * 2000,) * 8).check(DEMO)


@given(kind=st.sampled_from(sorted(LEVERS)), index=st.integers(0, 4), lower=st.integers(1, 64))
@examples("cost_grows_with_every_lever")
def test_lowering_a_lever_never_raises_the_cost(kind, index, lower):
    from ghosted.service import probes

    request = {"fit": FIT, "influence": wb.InfluenceRequest(), "evaluate": wb.EvalRequest(fit=FIT),
               "generate": wb.GenerationRequest(fit=FIT, prompts=("a b c",) * 6),
               "zeroshot": wb.ZeroShotRequest(fit=FIT), "token_losses": probes.TokenLossRequest(fit=FIT, passage="a"),
               "lens": probes.LensRequest(fit=FIT, prompt="a")}[kind]
    lever = LEVERS[kind][index % len(LEVERS[kind])]
    value = lever.read(request)
    cheaper = lever.write(request, max(lever.least, value - lower))
    before, after = estimate(request, SMOLLM2), estimate(cheaper, SMOLLM2)
    assert after.bytes <= before.bytes and after.flop <= before.flop


@pytest.fixture(scope="module")
def fitted_real_shaped():
    map_large_blocks()
    lm = real_shaped()
    fit = wb.FitRequest(model="real", layers=(2,), calib_seqs=4, seq_len=64, heldout_seqs=2, methods=("ghost",))
    return lm, fit, fit.compute(lm)


@given(window=st.sampled_from([64, 128, 256]), windows=st.integers(1, 4), batch=st.integers(1, 4))
@examples("cost_against_measured_peak")
def test_the_estimate_is_never_below_the_measured_peak_by_more_than_the_margin(window, windows, batch):
    from bench._common import in_child
    from bench.cost import measure_evaluation

    estimated, peak_mib = in_child(measure_evaluation, window, windows, batch)  # its peak is this request's alone
    assert estimated >= peak_mib - MARGIN_MIB, (estimated, peak_mib)
    assert estimated <= 2.5 * peak_mib + MARGIN_MIB, (estimated, peak_mib)  # an upper bound, not a wild one


@pytest.mark.slow
@pytest.mark.parametrize("size", ["small", "medium", "large"])
def test_on_the_bundled_model_the_estimate_is_never_below_the_measured_peak_by_more_than_the_margin(size):
    from bench._common import in_child
    from bench.cost import measure

    measured_row = in_child(measure, "bundled", size)  # a fresh process: its peak is this request's alone
    for job in ("fit", "evaluate"):
        estimated, peak = measured_row[job]
        assert estimated >= peak - MARGIN_MIB, (job, estimated, peak)


def test_every_request_kind_has_an_estimate():
    from ghosted.service import cost, probes, workbench

    kinds = {c.kind for module in (workbench, probes) for c in vars(module).values()
             if isinstance(c, type) and issubclass(c, workbench._Request) and c.kind}
    assert kinds and kinds <= set(cost.ESTIMATES), kinds - set(cost.ESTIMATES)
