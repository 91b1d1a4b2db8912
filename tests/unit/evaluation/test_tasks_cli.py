"""--tasks, --task-limit, --num-fewshot and --protocol: flags, the JSON report and the printed table,
on a tiny model (no download: lm-eval task names are skipped offline with one line)."""

from __future__ import annotations

import json

import pytest

from ghosted.cli import build_parser, main
from ghosted.evaluation.lastword import TASK, score_lastword
from ghosted.experiments.run import format_table, run_experiment
from ghosted.experiments.spec import ExperimentSpec
from ghosted.evaluation.protocols import PROTOCOLS, EvalProtocol, protocol_windows, resolve_protocol
from tests.tiny import CharTokenizer, small_config, tiny_loaded

FLAGS = ["--tasks", "--task-limit", "--num-fewshot", "--protocol"]


def small_run(**overrides) -> ExperimentSpec:
    base = dict(drop="3-4", methods=["dense", "none", "ghost"], calib_seqs=6, seq_len=32, heldout_seqs=2,
                eval_tokens=96, eval_seq_len=32, batch_size=4, device="cpu", dtype="float32")
    return ExperimentSpec().with_options(**{**base, **overrides})


@pytest.mark.parametrize("command", ["run", "grid"])
def test_help_documents_the_task_and_protocol_flags(command):
    text = build_parser()._subparsers._group_actions[0].choices[command].format_help()
    for flag in FLAGS:
        assert flag in text, (command, flag)
    assert TASK in text and "paper" in text


@pytest.fixture(scope="module")
def tiny_report():
    """A run with the bundled task and an lm-eval task, lm-eval made unavailable (as without the extra)."""
    import ghosted.evaluation.zeroshot as zeroshot

    def missing():
        raise zeroshot.ZeroShotUnavailable("Zero-shot accuracy needs lm-evaluation-harness: pip install ...")

    lm = tiny_loaded()
    cfg = small_run(tasks=[TASK, "arc_easy"], task_limit=6)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zeroshot, "_lm_eval", missing)
        report, run = run_experiment(cfg, loaded=lm)
    return lm, run, report


def test_report_has_accuracy_per_method_with_its_protocol(tiny_report):
    lm, run, report = tiny_report
    methods = [e["method"] for e in report["results"]]
    assert methods == ["dense", "none", "ghost"]
    models = {"dense": lm.model, **{m: r.model for m, r in run.results.items()}}
    expected = score_lastword(models, lm.tokenizer, limit=6)  # computed independently again
    for entry in report["results"]:
        scores = entry["tasks"][TASK]
        assert scores["acc"] == expected[entry["method"]].acc
        assert scores["acc_stderr"] == pytest.approx(expected[entry["method"]].acc_stderr, nan_ok=True)
        assert scores["loglikelihood"] == pytest.approx(expected[entry["method"]].loglikelihood)
        assert "task_average" not in entry  # one task scored: no average
    (proto,) = report["protocol"]["tasks"]
    assert (proto["task"], proto["version"], proto["examples"], proto["num_fewshot"], proto["metric"]) == (
        TASK, 1, 6, 0, "acc")
    assert list(report["tasks_skipped"]) == ["arc_easy"]
    assert "lm-evaluation-harness" in report["tasks_skipped"]["arc_easy"]
    assert report["protocol"]["perplexity"]["name"] == "custom"
    json.dumps(report, default=str)  # the JSON the CLI writes


def test_table_prints_accuracy_next_to_perplexity(tiny_report):
    _, _, report = tiny_report
    text = format_table(report)
    header, rule, *rows = text.splitlines()
    assert "ppl" in header and f"acc {TASK}" in header
    dense = report["results"][0]["tasks"][TASK]
    assert f"{100 * dense['acc']:.2f}" in rows[0]
    assert f"zero-shot: {TASK} v1, 6 examples, 0-shot" in text
    assert "zero-shot: skipped arc_easy: " in text and "protocol: custom" in text


def test_bundled_protocol_is_named_when_its_settings_are_used():
    assert resolve_protocol("", "bundled:wiki", 4096, 512).name == "bundled"
    assert resolve_protocol("", "bundled:news", 4096, 512).name == "custom"
    preset = resolve_protocol("bundled", "ignored", 1024, 256)
    assert (preset.sources, preset.seq_len, preset.tokens) == (("bundled:wiki",), 512, 1024)
    paper = resolve_protocol("paper", "bundled:wiki", 1024, 512)
    assert (paper.sources, paper.seq_len, paper.tokens) == (("wikitext-2-raw-v1", "ptb", "c4"), 2048, None)
    with pytest.raises(ValueError, match="Unknown protocol"):
        resolve_protocol("nope", "bundled:wiki", 1, 2)


def test_paper_protocol_offline_is_one_clear_error(capsys, monkeypatch):

    lm = tiny_loaded()
    lm.model.config.max_position_embeddings = 4096  # room for the paper's 2048-token windows
    monkeypatch.setattr("ghosted.experiments.session.load_spec_model", lambda *_: lm)
    code = main(["run", "--drop", "3-4", "--methods", "none", "--protocol", "paper", "--calib-seqs", "4",
                 "--seq-len", "32", "--heldout-seqs", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert "error: The paper protocol needs wikitext-2-raw-v1, ptb, c4" in err and "--protocol bundled" in err
    assert "Traceback" not in err
    assert err.count("skipping") == 3  # one line per text that could not be loaded


def test_preset_skips_an_unloadable_text_and_keeps_the_others():
    lines = []
    proto = EvalProtocol("paper", ("wikitext-2-raw-v1", "bundled:news"), 32, 64)
    windows, skipped = protocol_windows(CharTokenizer(), proto, lines.append)
    assert list(windows) == ["bundled:news"] and list(skipped) == ["wikitext-2-raw-v1"]
    assert lines == [f"protocol paper: skipping wikitext-2-raw-v1: {skipped['wikitext-2-raw-v1']}"]
    assert windows["bundled:news"].input_ids.shape == (2, 32)


def test_several_texts_give_a_perplexity_each(monkeypatch):
    monkeypatch.setitem(PROTOCOLS, "two", EvalProtocol("two", ("bundled:wiki", "bundled:news"), 32, 64, "test"))
    report, _ = run_experiment(small_run(protocol="two", methods=["dense", "none"]), loaded=tiny_loaded())
    for entry in report["results"]:
        assert list(entry["ppl_by_source"]) == ["bundled:wiki", "bundled:news"]
        assert entry["ppl"] == entry["ppl_by_source"]["bundled:wiki"]
    assert entry["ppl_by_source"]["bundled:wiki"] != entry["ppl_by_source"]["bundled:news"]
    assert list(report["protocol"]["evaluations"]) == ["bundled:wiki", "bundled:news"]
    header = format_table(report).splitlines()[0]
    assert "ppl bundled:wi" in header and "ppl bundled:ne" in header


def test_cli_passes_the_task_flags(monkeypatch, tmp_path, capsys):
    import ghosted.experiments.run as pipeline

    seen = {}

    def fake_run(cfg, loaded=None, **_):
        seen["cfg"] = cfg
        return {"results": [], "protocol": {"evaluation": {}, "calibration": None}, "model": "m", "dropped_spec": "",
                "layers": 1}, None
    monkeypatch.setattr(pipeline, "run_experiment", fake_run)
    out = tmp_path / "r.json"
    code = main(["run", "--drop", "3", "--tasks", f" {TASK}, arc_easy ,{TASK}", "--task-limit", "50",
                 "--num-fewshot", "2", "--protocol", "bundled", "--out", str(out)])
    assert code == 0
    ev = seen["cfg"].evaluation  # run_experiment gets the experiment spec
    assert (ev.tasks, ev.task_limit, ev.num_fewshot, ev.protocol) == ([TASK, "arc_easy"], 50, 2, "bundled")
    assert json.loads(out.read_text())["model"] == "m"


@pytest.mark.parametrize("flags,message", [(["--task-limit", "0"], "--task-limit must be at least 1"),
                                           (["--num-fewshot", "-1"], "--num-fewshot must be 0 or more")])
def test_bad_task_flags_are_clear_errors(flags, message, capsys):
    assert main(["run", "--drop", "3", "--tasks", TASK, *flags]) == 2
    assert message in capsys.readouterr().err


def test_grid_scores_tasks_per_setting_and_writes_them(tmp_path):
    from ghosted.grid.run import run_grid

    cfg = small_config(selections=["shortgpt"], n_values=[2], methods=["dense", "none", "ghost"],
                       evals=["bundled:wiki"], tasks=[TASK], task_limit=4)
    result = run_grid(cfg, loaded=tiny_loaded())
    acc = result.tasks[result.tasks.metric == "acc"]
    assert list(acc.model) == ["dense", "none", "ghost"] and set(acc.task) == {TASK}
    assert set(acc.n) == {2} and acc.value.between(0, 1).all()
    assert result.meta["tasks"]["protocols"][TASK]["examples"] == 4
    assert f"Zero-shot accuracy on {TASK}" in result.markdown()
    paths = result.save(tmp_path)
    assert (tmp_path / "grid_tasks.csv") in paths
    assert json.loads((tmp_path / "grid.json").read_text())["tasks"][0]["task"] == TASK
    assert result.meta["protocol"]["name"] == "custom"


def test_table_shows_normalised_accuracy_and_the_average_where_tasks_have_them():
    from ghosted.evaluation.zeroshot import task_columns

    report = {"protocol": {"tasks": [{"task": "hellaswag", "metrics": ["acc", "acc_norm"]},
                                     {"task": TASK, "metrics": ["acc", "loglikelihood"]}]},
              "results": [{"method": "dense", "task_average": 0.4,
                           "tasks": {"hellaswag": {"acc": 0.3, "acc_stderr": 0.01, "acc_norm": 0.35,
                                                   "acc_norm_stderr": 0.02},
                                     TASK: {"acc": 0.5, "acc_stderr": 0.03}}}]}
    header, (cells,) = task_columns(report)
    assert header.split() == ["acc", "hellaswag", "acc_norm", "hellaswag", "acc", TASK, "acc", "avg"]
    assert cells.split() == ["30.00", "±", "1.00", "35.00", "±", "2.00", "50.00", "±", "3.00", "40.00"]
