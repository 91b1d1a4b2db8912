"""bundled-lastword: the examples, Ghosted's scorer against an independent computation and against
lm-evaluation-harness, and shared-prefix scoring against scoring each variant alone."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import transformers as tf

from ghosted.evaluation.lastword import (MAX_WORDS, MIN_WORDS, SIZE, TASK, encode_pair, examples, max_length, protocol,
                                         qualifies, score_lastword)
from ghosted.models.pruning import prune
from ghosted.recovery.fitting import recover
from ghosted.data.windows import TokenWindows
from ghosted.data.sources import resolve_source
from tests.tiny import random_ids, tiny_model
from tests.tiny import CharTokenizer

LIMIT = 12  # examples scored in the fast tests


def test_examples_come_from_the_evaluation_part_only():
    rows = examples()
    source = resolve_source("bundled:wiki")
    evaluation = {p for doc in source.part("evaluation") for p in doc.split("\n")}
    calibration = "\n".join(source.part("calibration"))
    assert len(rows) == SIZE and [r["id"] for r in rows] == list(range(SIZE))
    for row in rows:
        assert any(p.startswith(row["text"]) and qualifies(p) for p in evaluation if p[:20] == row["text"][:20])
        assert row["text"] not in calibration
        assert row["context"] + row["target"] == row["text"] and row["target"][0] == " "
        assert row["target"][1:].isalpha() and MIN_WORDS <= len(row["text"].split(" ")) <= MAX_WORDS
    assert len({r["text"] for r in rows}) == SIZE
    assert len({r["article"] for r in rows}) > 10  # the seeded shuffle spreads over the articles


def test_examples_are_deterministic_and_limit_takes_the_first():
    assert examples(7) == examples()[:7] == examples(7)
    with pytest.raises(ValueError, match="at least 1"):
        examples(0)


def test_qualifies():
    words = " ".join(["word"] * (MIN_WORDS - 1))
    assert qualifies(words + " end.") and qualifies(words + " end?")
    assert not qualifies(words + " end")  # no sentence end
    assert not qualifies(words + " 1905.")  # not alphabetic
    assert not qualifies("too short.")
    assert not qualifies(" ".join(["word"] * (MAX_WORDS + 1)) + ".")


def test_encode_pair_moves_trailing_space_and_truncates_left():
    tok = CharTokenizer()
    ids, target = encode_pair(tok, "abc ", "de", limit=100)
    assert target == tok.encode(" de") and ids == tok.encode("abc d")
    ids, target = encode_pair(tok, "abcdefgh", " x", limit=4)
    assert ids == tok.encode("abcdefgh x")[-5:-1] and target == tok.encode(" x")


def alone(model, tokenizer, rows) -> list[tuple[float, bool]]:
    """Each example on its own, no padding: log-probs of the target tokens from a plain forward pass."""
    out = []
    limit = max_length(model, tokenizer)
    for row in rows:
        whole = tokenizer.encode(row["text"])[-(limit + 1):]
        target = tokenizer.encode(row["text"])[len(tokenizer.encode(row["context"])):]
        logits = model(input_ids=torch.tensor([whole[:-1]]), use_cache=False).logits[0]  # (T, V)
        logp = F.log_softmax(logits.float(), dim=-1)[-len(target):]  # (n, V)
        t = torch.tensor(target)
        out.append((float(logp.gather(1, t[:, None]).sum()), bool((logp.argmax(-1) == t).all())))
    return out


def test_scorer_matches_each_example_run_alone():
    model, tok = tiny_model("llama"), CharTokenizer()
    res = score_lastword({"m": model}, tok, limit=LIMIT, batch_size=5)["m"]
    expected = alone(model, tok, examples(LIMIT))
    assert res.examples == LIMIT and res.correct == [g for _, g in expected]
    assert res.logprobs == pytest.approx([ll for ll, _ in expected], rel=1e-5, abs=1e-5)
    acc = sum(g for _, g in expected) / LIMIT
    assert res.acc == pytest.approx(acc)
    std = math.sqrt(sum((g - acc) ** 2 for _, g in expected) / (LIMIT - 1) / LIMIT)
    assert res.acc_stderr == pytest.approx(std)
    assert res.loglikelihood == pytest.approx(sum(ll for ll, _ in expected) / LIMIT, rel=1e-5)


def test_shared_prefix_scoring_equals_scoring_each_variant_alone():
    model, tok = tiny_model("llama", layers=6), CharTokenizer()
    calib = TokenWindows(random_ids(6, 32, 0), torch.ones(6, 32, dtype=torch.long), {})
    held = TokenWindows(random_ids(2, 32, 1), torch.ones(2, 32, dtype=torch.long), {})
    run = recover(model, "3-4", ["none", "ghost", "ghost-auto", "linearpatch-diag"], calib, held)
    models = {"dense": model, **{name: r.model for name, r in run.results.items()}}
    steps = []
    shared = score_lastword(models, tok, limit=LIMIT, batch_size=4,
                            progress=lambda stage, done, total: steps.append((done, total)))
    separate = score_lastword(models, tok, limit=LIMIT, batch_size=4, share=False)
    assert steps[-1] == (3, 3)  # one step per batch: the prefix ran once for every variant
    for name in models:
        assert shared[name].correct == separate[name].correct, name
        assert shared[name].logprobs == pytest.approx(separate[name].logprobs, rel=1e-9, abs=1e-9), name
    assert shared["dense"].logprobs != pytest.approx(shared["none"].logprobs)  # the variants do differ


def lm_eval_scores(model, tokenizer, limit: int) -> dict:
    """acc and mean log-likelihood of ``bundled-lastword`` computed by lm-evaluation-harness (HFLM)."""
    from ghosted.evaluation.zeroshot import evaluate_tasks

    run = evaluate_tasks({"m": model}, tokenizer, [TASK], limit=limit, ghosted_scorer=False)
    assert run.protocols[TASK]["scorer"].startswith("lm-evaluation-harness") and not run.skipped
    assert run.protocols[TASK]["examples"] == limit and run.protocols[TASK]["num_fewshot"] == 0
    return dict(zip(run.frame.metric, run.frame.value))


def test_lm_eval_runs_the_bundled_task_and_agrees_on_a_tiny_model(bundled):
    """A tiny random model with the bundled tokenizer: lm-eval's HFLM and Ghosted's scorer agree."""
    pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install -r requirements-eval.txt")
    config = tf.LlamaConfig(vocab_size=len(bundled.tokenizer), hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                            max_position_embeddings=1024)
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config).eval()
    ours = score_lastword({"m": model}, bundled.tokenizer, limit=20)["m"]
    theirs = lm_eval_scores(model, bundled.tokenizer, 20)
    assert ours.acc == theirs["acc"]
    assert ours.loglikelihood == pytest.approx(theirs["loglikelihood"], rel=1e-4)


@pytest.mark.slow
def test_lm_eval_agrees_on_the_bundled_model_dense_and_pruned(bundled):
    pytest.importorskip("lm_eval", reason="lm-eval is an optional extra: pip install -r requirements-eval.txt")
    models = {"dense": bundled.model, "pruned": prune(bundled.model, "12-18")}
    ours = score_lastword(models, bundled.tokenizer, limit=20)
    for name, model in models.items():
        theirs = lm_eval_scores(model, bundled.tokenizer, 20)
        assert ours[name].acc == theirs["acc"], name
        assert ours[name].loglikelihood == pytest.approx(theirs["loglikelihood"], rel=1e-4), name
    assert ours["dense"].acc > ours["pruned"].acc  # 7 layers gone cost answers (0.55 against 0.30)


def test_protocol_names_the_task():
    proto = protocol(20)
    assert (proto["task"], proto["examples"], proto["num_fewshot"], proto["metric"]) == (TASK, 20, 0, "acc")
    assert "evaluation part" in proto["source"] and proto["version"] == 1
