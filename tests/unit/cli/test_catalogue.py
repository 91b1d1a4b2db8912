"""The catalogue of bad inputs: every mistake a user can make gets one clear refusal, and nothing on disk
changes.

Three tables, one per front end; append a row to cover a new mistake:

- ``CLI_CASES``: arguments of ``python -m ghosted``; exit code 2 (argparse's own errors included) and the
  key words of the one-line message on stderr.
- ``API_CASES``: a call of the Python API on a tiny model; the exception type and its key words.
- ``APP_CASES``: a page of the Streamlit app driven by AppTest; an ``st.error`` with the key words and no
  ``st.exception``.

Each case runs in an empty working folder (plus the files it names, made by ``make_files``); the folder,
and the files given to the case, are snapshotted (names, sizes, modification times) before and after, so a
refusal that wrote or removed anything fails. Most cases fail before a model is loaded; a few read the
bundled model's config (``--dry-run``), and the app cases load the bundled model.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import ghosted
from ghosted.cli import main
from ghosted.data.windows import TokenWindows
from tests.tiny import random_ids, tiny_model

LATIN1 = "Caf\xe9 cr\xe8me, na\xefve fa\xe7ade.\n\nUn deuxi\xe8me document.\n".encode("latin-1")


def make_files(folder: Path) -> None:
    """The files the cases name: a latin-1 text, an empty Markdown text, a folder, a plain file."""
    (folder / "latin1.txt").write_bytes(LATIN1)
    (folder / "empty.md").write_text("   \n\n")
    (folder / "texts").mkdir()
    (folder / "texts" / "a.txt").write_text("one document\n\nanother one\n")
    (folder / "report.json").write_text("{}")


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder``: (size, mtime in ns)."""
    return {str(p.relative_to(folder)): (p.stat().st_size if p.is_file() else -1, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working folder holding only ``make_files``; relative outputs would land here."""
    make_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    yield tmp_path
    assert snapshot(tmp_path) == before, "a refused command changed files on disk"


# ---- the command line ----------------------------------------------------------------------------------


@dataclass
class CliCase:
    name: str
    argv: list[str]
    words: list[str]  # all must appear in stderr (case-insensitive)
    code: int = 2


RUN = ["run", "--drop", "20-26"]
CLI_CASES = [
    CliCase("calib-seqs 0 (was a KeyError)", [*RUN, "--calib-seqs", "0"], ["calib_seqs", "--calib-seqs", "at least 1"]),
    CliCase("batch-size 0 (was a ZeroDivisionError)", [*RUN, "--batch-size", "0"], ["--batch-size", "at least 1"]),
    CliCase("seq-len 1", [*RUN, "--seq-len", "1"], ["--seq-len", "at least 2"]),
    CliCase("negative held-out windows", [*RUN, "--heldout-seqs", "-1"], ["--heldout-seqs", "at least 0"]),
    CliCase("eval-tokens 0", [*RUN, "--eval-tokens", "0"], ["--eval-tokens", "at least 1"]),
    CliCase("a trillion calibration windows", [*RUN, "--calib-seqs", "1000000000000", "--dry-run"],
            ["--calib-seqs", "at most"]),
    CliCase("windows x length past the bound", [*RUN, "--calib-seqs", "100000", "--seq-len", "100000", "--dry-run"],
            ["tokens", "fewer or shorter windows"]),
    CliCase("eval-tokens 10**15", [*RUN, "--eval-tokens", "1000000000000000", "--dry-run"],
            ["--eval-tokens", "at most"]),
    CliCase("seeds 0", [*RUN, "--seeds", "0", "--dry-run"], ["--seeds", "at least 1"]),
    CliCase("a million seeds", [*RUN, "--seeds", "1000000", "--dry-run"], ["--seeds", "at most"]),
    CliCase("batch-size 10**9", [*RUN, "--batch-size", "1000000000", "--dry-run"], ["--batch-size", "at most"]),
    CliCase("eval-tokens below one window", [*RUN, "--eval-tokens", "100"], ["less than one window", "512"]),
    CliCase("eval-seq-len 1", [*RUN, "--eval-seq-len", "1"], ["--eval-seq-len", "at least 2"]),
    CliCase("eps nan", [*RUN, "--eps", "nan"], ["--eps", "finite"]),
    CliCase("eps inf", [*RUN, "--eps", "inf"], ["--eps", "finite"]),
    CliCase("eps negative", [*RUN, "--eps", "-1"], ["--eps", ">= 0"]),
    CliCase("seed negative", [*RUN, "--seed", "-1"], ["--seed", "at least 0"]),
    CliCase("seed 2**32", [*RUN, "--seed", str(2**32)], ["--seed", "2**32"]),
    CliCase("no methods", [*RUN, "--methods", ","], ["at least one method"]),
    CliCase("unknown method", [*RUN, "--methods", "ghost,ghots"], ["unknown method", "ghots"]),
    CliCase("unknown criterion", ["run", "--select", "shortgtp", "--n", "3"], ["unknown criterion", "shortgtp"]),
    CliCase("select without n", ["run", "--select", "bi"], ["--n", "at least 1"]),
    CliCase("drop and select", ["run", "--drop", "3", "--select", "bi", "--n", "3"], ["either", "not both"]),
    CliCase("backwards range", ["run", "--drop", "26-20"], ["backwards", "20-26"]),
    CliCase("unreadable drop spec", ["run", "--drop", "twenty"], ["cannot read layer spec", "twenty"]),
    CliCase("fitted method without layers", ["run", "--methods", "none"], ["need layers to drop", "--drop"]),
    CliCase("ghost-auto without held-out windows", [*RUN, "--heldout-seqs", "0"], ["ghost-auto", "--heldout-seqs"]),
    CliCase("missing text file", [*RUN, "--calib", "no-such-notes.md"], ["not found", "no-such-notes.md"]),
    CliCase("text folder", [*RUN, "--calib", "texts"], ["is a directory"]),
    CliCase("latin-1 text", [*RUN, "--calib", "latin1.txt"], ["latin1.txt", "not utf-8", "iconv"]),
    CliCase("empty text", [*RUN, "--eval", "empty.md"], ["empty.md", "empty"]),
    CliCase("unknown text source", [*RUN, "--eval", "wikitext2"], ["unknown text source", "wikitext2"]),
    CliCase("--out names a folder", [*RUN, "--out", "texts"], ["--out", "is a folder"]),
    CliCase("--out inside a file", [*RUN, "--out", "report.json/r.json"], ["report.json", "is a file"]),
    CliCase("not a number (argparse)", [*RUN, "--calib-seqs", "many"], ["--calib-seqs", "invalid int"]),
    CliCase("unknown choice (argparse)", [*RUN, "--ghost-mode", "parallel"], ["--ghost-mode", "invalid choice"]),
    CliCase("unknown flag (argparse)", [*RUN, "--calib-sequences", "4"], ["unrecognized arguments"]),
    CliCase("missing model folder", [*RUN, "--model", "./no-such-model", "--dry-run"], ["no such model folder"]),
    CliCase("drop every layer", ["run", "--drop", "0-29", "--dry-run"], ["all 30 layers", "keep at least one"]),
    CliCase("layers out of range", ["run", "--drop", "28-40", "--dry-run"], ["do not exist", "0..29"]),
    CliCase("huge layer range (bounded before allocating)", ["run", "--drop", "0-99999999999", "--dry-run"],
            ["99999999999", "beyond any model", "at most 1024"]),
    CliCase("huge layer range in export", ["export", "--drop", "5-99999999999", "--out", "new-model", "--dry-run"],
            ["99999999999", "beyond any model"]),
    CliCase("window beyond positions", [*RUN, "--seq-len", "9000", "--dry-run"], ["9000", "max_position_embeddings"]),
    CliCase("select n = every layer", ["run", "--select", "bi", "--n", "30", "--dry-run"], ["--n", "every layer"]),
    CliCase("grid n 0", ["grid", "--n", "0"], ["--n", "at least 1"]),
    CliCase("grid n not a number", ["grid", "--n", "seven"], ["--n", "whole numbers"]),
    CliCase("grid unknown selection", ["grid", "--selections", "streamlin"], ["unknown criterion", "streamlin"]),
    CliCase("grid no evaluation text", ["grid", "--evals", ","], ["at least one evaluation text"]),
    CliCase("grid --out-dir is a file", ["grid", "--out-dir", "report.json"], ["report.json", "is a file"]),
    CliCase("grid no methods", ["grid", "--methods", ","], ["at least one method"]),
    CliCase("influence unknown criterion", ["influence", "--metrics", "cosine"], ["unknown criterion", "cosine"]),
    CliCase("influence no criterion", ["influence", "--metrics", ","], ["at least one criterion"]),
    CliCase("influence n 0", ["influence", "--n-values", "0"], ["--n-values", "at least 1"]),
    CliCase("influence candidate windows", ["influence", "--candidate-windows", "-2"], ["--candidate-windows"]),
    CliCase("influence gram budget", ["influence", "--max-gram-gib", "0"], ["--max-gram-gib", "above 0"]),
    CliCase("export no layers", ["export", "--drop", "", "--out", "model-out"], ["layers to drop"]),
    CliCase("export --out is a file", ["export", "--drop", "20-26", "--out", "report.json"],
            ["report.json", "is a file"]),
    CliCase("export eps nan", ["export", "--drop", "20-26", "--eps", "nan", "--out", "m"], ["--eps", "finite"]),
    CliCase("export calib-seqs 0", ["export", "--drop", "20-26", "--calib-seqs", "0", "--out", "m"], ["--calib-seqs"]),
    CliCase("export without --out (argparse)", ["export", "--drop", "20-26"], ["--out", "required"]),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.name for c in CLI_CASES])
def test_cli_refuses(case: CliCase, workdir, capsys):
    try:
        code = main(case.argv)
    except SystemExit as stop:  # argparse: usage and one error line
        code = stop.code
    err = capsys.readouterr().err
    assert code == case.code, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1].lower()
    assert last.startswith(("error:", "python -m ghosted")), err
    for word in case.words:
        assert word.lower() in last, (word, last)


def test_debug_shows_the_traceback(workdir, capsys):
    assert main(["--debug", *RUN, "--calib-seqs", "0"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "--calib-seqs" in err.splitlines()[-1]


# ---- the Python API -----------------------------------------------------------------------------------


def windows(n: int = 4, length: int = 16) -> TokenWindows:
    ids = random_ids(n, length)  # (n, length)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random"})


class NoTokenizer:
    """Stands in for a tokenizer in cases that must fail before any text is tokenised: using it would
    raise AttributeError, not the error the case expects."""


@dataclass
class ApiCase:
    name: str
    call: object  # (model, folder) -> anything; must raise
    error: type
    words: list[str] = field(default_factory=list)


API_CASES = [
    ApiCase("fit drops every layer (was an IndexError)", lambda m, d: ghosted.fit(m, "0-5", windows(), ["ghost"]),
            ValueError, ["all 6 layers", "keep at least one"]),
    ApiCase("fit float layers", lambda m, d: ghosted.fit(m, [1.0, 2.0], windows(), ["ghost"]), TypeError,
            ["whole numbers", "1.0"]),
    ApiCase("fit bool layers", lambda m, d: ghosted.fit(m, [True], windows(), ["ghost"]), TypeError, ["true"]),
    ApiCase("fit a float spec", lambda m, d: ghosted.fit(m, 2.5, windows(), ["ghost"]), TypeError, ["2.5"]),
    ApiCase("fit layers out of range", lambda m, d: ghosted.fit(m, "4-9", windows(), ["ghost"]), ValueError,
            ["do not exist", "0..5"]),
    ApiCase("fit no methods", lambda m, d: ghosted.fit(m, "2", windows(), []), ValueError, ["at least one method"]),
    ApiCase("fit unknown method", lambda m, d: ghosted.fit(m, "2", windows(), ["gost"]), ValueError,
            ["unknown method", "gost"]),
    ApiCase("fit eps nan", lambda m, d: ghosted.fit(m, "2", windows(), ["ghost"], eps=math.nan), ValueError,
            ["eps", "finite"]),
    ApiCase("fit batch size 0", lambda m, d: ghosted.fit(m, "2", windows(), ["ghost"], batch_size=0), ValueError,
            ["batch_size", "at least 1"]),
    ApiCase("fit seed too large", lambda m, d: ghosted.fit(m, "2", windows(), ["ghost"], seed=2**40), ValueError,
            ["seed", "2**32"]),
    ApiCase("fit unknown setting", lambda m, d: ghosted.fit(m, "2", windows(), ["ghost"], ridge=1.0), TypeError,
            ["unknown experiment setting", "ridge", "ghost_mode"]),
    ApiCase("fit no windows", lambda m, d: ghosted.fit(m, "2", windows(0), ["ghost"]), ValueError, ["no window"]),
    ApiCase("fit windows beyond positions", lambda m, d: ghosted.fit(m, "2", windows(2, 200), ["ghost"]),
            ValueError, ["200", "128 positions"]),
    ApiCase("calibrate calib_seqs 0", lambda m, d: ghosted.calibrate(NoTokenizer(), calib_seqs=0), ValueError,
            ["calib_seqs", "at least 1"]),
    ApiCase("calibrate float length", lambda m, d: ghosted.calibrate(NoTokenizer(), seq_len=64.0), TypeError,
            ["seq_len", "whole number"]),
    ApiCase("calibrate seed too large", lambda m, d: ghosted.calibrate(NoTokenizer(), seed=2**32), ValueError,
            ["seed", "2**32"]),
    ApiCase("calibrate from a folder", lambda m, d: ghosted.calibrate(NoTokenizer(), str(d / "texts")), ValueError,
            ["is a directory"]),
    ApiCase("calibrate latin-1", lambda m, d: ghosted.calibrate(NoTokenizer(), str(d / "latin1.txt")), ValueError,
            ["not utf-8", "iconv"]),
    ApiCase("calibrate missing file", lambda m, d: ghosted.calibrate(NoTokenizer(), "missing.cor"), FileNotFoundError,
            ["not found", "missing.cor"]),
    ApiCase("evaluate batch size 0", lambda m, d: ghosted.evaluate(m, windows(), batch_size=0), ValueError,
            ["batch_size"]),
    ApiCase("evaluate tokens below a window", lambda m, d: ghosted.evaluate(m, NoTokenizer(), eval_tokens=64,
                                                                                  eval_seq_len=128),
            ValueError, ["less than one window"]),
    ApiCase("evaluate beyond positions", lambda m, d: ghosted.evaluate(m, windows(1, 256)), ValueError,
            ["256", "max_position_embeddings"]),
    ApiCase("influence unknown criterion", lambda m, d: ghosted.influence(m, windows(), metrics=["cosine"]),
            ValueError, ["unknown criterion", "cosine"]),
    ApiCase("influence no criterion", lambda m, d: ghosted.influence(m, windows(), metrics=[]), ValueError,
            ["at least one criterion"]),
    ApiCase("influence n = every layer", lambda m, d: ghosted.influence(m, windows(), n_values=[6]), ValueError,
            ["every layer", "at most 5"]),
    ApiCase("influence unknown setting", lambda m, d: ghosted.influence(m, windows(), n=[3]), TypeError,
            ["unknown settings"]),
    ApiCase("influence eps negative", lambda m, d: ghosted.influence(m, windows(), eps=-1.0), ValueError, ["eps"]),
    ApiCase("select unknown criterion", lambda m, d: ghosted.select(m, "shortgtp", 2, windows=windows()), ValueError,
            ["unknown criterion", "shortgtp"]),
    ApiCase("select n 0", lambda m, d: ghosted.select(m, "bi", 0, windows=windows()), ValueError, ["at least 1"]),
    ApiCase("select float n", lambda m, d: ghosted.select(m, "bi", 2.0, windows=windows()), TypeError,
            ["whole number"]),
    ApiCase("prune every layer", lambda m, d: ghosted.prune(m, range(6)), ValueError, ["keep at least one"]),
]


@pytest.mark.parametrize("case", API_CASES, ids=[c.name for c in API_CASES])
def test_api_refuses(case: ApiCase, workdir):
    model = tiny_model("llama")  # 6 layers, 128 positions
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(case.error) as raised:
        case.call(model, workdir)
    message = str(raised.value).lower()
    for word in case.words:
        assert word.lower() in message, (word, message)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is untouched


# ---- the app ------------------------------------------------------------------------------------------


@dataclass
class AppCase:
    name: str
    act: object  # (AppTest, folder) -> AppTest
    words: list[str]


def calibrate_with_path(path_of):
    """Select two layers and calibrate on a local text file given by ``path_of(folder)``."""
    def act(at, folder):
        at.session_state["ghosted.selection"] = [20, 21]
        at.switch_page("pages/recover.py").run()
        at.radio(key="calib_kind").set_value("path").run()
        at.text_input(key="calib_path").set_value(str(path_of(folder)))
        at.number_input(key="calib_seqs").set_value(2)
        at.number_input(key="seq_len").set_value(16)
        return at.button(key="calibrate_run").click().run()
    return act


def calibrate_layers(layers):
    def act(at, folder):
        at.session_state["ghosted.selection"] = layers
        at.switch_page("pages/recover.py").run()
        return at.button(key="calibrate_run").click().run()
    return act


APP_CASES = [
    AppCase("drop every layer", calibrate_layers(list(range(30))), ["drops all 30 layers"]),
    AppCase("a text folder", calibrate_with_path(lambda d: d / "texts"), ["is a directory"]),
    AppCase("a latin-1 text", calibrate_with_path(lambda d: d / "latin1.txt"), ["not utf-8", "iconv"]),
    AppCase("a missing text", calibrate_with_path(lambda d: d / "nowhere.md"), ["not found", "nowhere.md"]),
]


@pytest.mark.slow  # the app loads the bundled model (the Model page's default) in its script thread
@pytest.mark.parametrize("case", APP_CASES, ids=[c.name for c in APP_CASES])
def test_app_refuses(case: AppCase, workdir, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.app.conftest import ROOT, TIMEOUT, serve_navigation

    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    monkeypatch.delenv("GHOSTED_DEPLOY", raising=False)
    serve_navigation(monkeypatch)
    at = case.act(AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run(), workdir)
    assert not at.exception, [e.value for e in at.exception]
    shown = " ".join(e.value for e in at.error).lower()
    for word in case.words:
        assert word.lower() in shown, (word, shown)
    assert "ghosted.run" not in at.session_state


def test_the_catalogue_is_large():
    assert len(CLI_CASES) + len(API_CASES) + len(APP_CASES) >= 40


# ---- what the refusals make room for: names and files people use ---------------------------------------


@pytest.mark.parametrize("alias, criterion", [("shortgpt", "seqcos_shortgpt"), ("bi", "block_influence"),
                                              ("streamline", "seqcos_streamline"), ("angular", "angular_last"),
                                              ("ppl", "ppl_single"), ("taylor+", "taylor"), ("sleb", "sleb"),
                                              ("Block_Influence", "block_influence")])
def test_criteria_aliases(alias, criterion):
    from ghosted.selection.criteria import resolve_criterion

    assert resolve_criterion(alias) == criterion


def test_aliases_are_in_the_help():
    from ghosted.cli import build_parser

    choices = build_parser()._subparsers._group_actions[0].choices
    for command in ("run", "influence"):
        text = " ".join(choices[command].format_help().split())
        for alias in ("shortgpt", "bi =", "streamline", "angular", "ppl", "taylor+"):
            assert alias in text, (command, alias)


def test_select_by_alias_equals_select_by_name():
    model, win = tiny_model("llama"), windows()
    assert ghosted.select(model, "bi", 2, windows=win) == ghosted.select(model, "block_influence", 2, windows=win)


@pytest.mark.parametrize("name", ["notes.md", "corpus.cor", "plain", "bom.txt"])
def test_plain_text_is_read_by_content(name, tmp_path):
    from ghosted.data.sources import resolve_source

    body = "First document, line one.\n\nSecond document.\n"
    data = ("\ufeff" + body if name == "bom.txt" else body).encode("utf-8")
    (tmp_path / name).write_bytes(data)
    src = resolve_source(str(tmp_path / name))
    assert src.documents == ("First document, line one.", "Second document.")


def test_jsonl_by_extension(tmp_path):
    from ghosted.data.sources import resolve_source

    (tmp_path / "docs.jsonl").write_text('{"text": "one"}\n{"text": "two"}\n')
    assert resolve_source(str(tmp_path / "docs.jsonl")).documents == ("one", "two")


def word_tokenizer():
    """A word-level tokenizer without BOS over w0..w19999 (one token per word), built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"w{i}": i + 1 for i in range(20000)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def test_a_separate_evaluation_file_is_used_whole_from_its_start(tmp_path):
    from ghosted.data.windows import evaluation_windows

    words = [f"w{i}" for i in range(20000)]  # 20,000 tokens in 100 documents of 200
    path = tmp_path / "test-split.txt"
    path.write_text("\n\n".join(" ".join(words[i:i + 200]) for i in range(0, 20000, 200)))
    tok = word_tokenizer()
    whole = evaluation_windows(tok, str(path), 16384, 512, calibration_source="bundled:news")
    assert whole.protocol["part"] == "whole" and whole.input_ids.shape == (32, 512)
    assert tok.convert_ids_to_tokens(whole.input_ids.flatten().tolist()) == words[:16384]  # from its start
    same = evaluation_windows(tok, str(path), 2048, 512, calibration_source=str(path))
    assert same.protocol["part"] == "evaluation"  # the same source as calibration: its last 20 % only
    assert tok.convert_ids_to_tokens(same.input_ids[0, :1].tolist()) == ["w16000"]
    with pytest.raises(ValueError, match="has 4000 tokens"):
        evaluation_windows(tok, str(path), 16384, 512, calibration_source=str(path))


def test_run_reports_which_part_it_evaluated(tmp_path):
    from ghosted.experiments.spec import ExperimentSpec
    from ghosted.experiments.facts import facts_of_config
    from ghosted.experiments.plans import plan_run
    from tests.tiny import tiny_config

    plan = plan_run(ExperimentSpec().with_options(drop="2", eval="bundled:news", methods=["none"], eval_seq_len=128,
                                                  seq_len=64),
                    facts_of_config(tiny_config("llama")))
    assert "bundled:news (evaluation part)" in plan
    plan = plan_run(ExperimentSpec().with_options(drop="2", methods=["none"], eval_seq_len=128, seq_len=64),
                    facts_of_config(tiny_config("llama")))
    assert "bundled:wiki (the whole text)" in plan and "layers to drop: 2" in plan


def test_environment_is_offline():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_same_settings_give_bitwise_equal_models_and_perplexities():
    model, win = tiny_model("llama"), windows(8, 16)
    runs = [ghosted.fit(model, "2-3", win, ["ghost", "ghost-auto"], heldout=windows(2, 16), seed=3) for _ in range(2)]
    for method in ("ghost", "ghost-auto"):
        a, b = (run.results[method].model for run in runs)
        assert torch.equal(a(win.input_ids).logits, b(win.input_ids).logits)
        assert ghosted.evaluate(a, win).ppl == ghosted.evaluate(b, win).ppl
