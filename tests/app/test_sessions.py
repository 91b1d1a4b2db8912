"""Two browser sessions sharing the one cached model: each keeps its own results, the model stays as loaded.

Two AppTest instances in one process are two sessions of one server: ``st.cache_resource`` is
process-wide, so both get the very same model object (checked), and nothing is cleared between them.
They drop different layers with different methods, interleaved, and each must see only its own run
and perplexities, on its own pages, while the cached model's weights (sha256 over every parameter
and buffer) and its layer numbering stay exactly as loaded.
"""

import hashlib

import pytest
import torch
from streamlit.testing.v1 import AppTest

from ghosted.models.architecture import layers_of
from pages._ui import MODEL, load_cached
from tests.app.conftest import ROOT, TIMEOUT, calibrate, errors, no_exception, open_page, run_of

SESSIONS = {"a": ([20, 21], ["ghost"]), "b": ([9, 10, 11], ["linearpatch-diag"])}  # layers, methods


def fingerprint(model) -> dict:
    """What any session could have changed: every weight's bytes, the layer list and its numbering."""
    digest = hashlib.sha256()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    layers = layers_of(model)
    return {"sha256": digest.hexdigest(), "layers": len(layers), "config_layers": model.config.num_hidden_layers,
            "layer_idx": [layer.self_attn.layer_idx for layer in layers],
            "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())}


def evaluate(at: AppTest) -> AppTest:
    open_page(at, "compare")
    at.number_input(key="eval_tokens").set_value(1024)
    at.number_input(key="eval_seq_len").set_value(256)
    return at.button(key="evaluate_run").click().run()


@pytest.fixture
def sessions(monkeypatch):
    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    monkeypatch.delenv("GHOSTED_DEPLOY", raising=False)
    return {name: AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run() for name in SESSIONS}


def test_two_sessions_keep_their_own_results_and_leave_the_shared_model_unchanged(sessions):
    a, b = sessions["a"], sessions["b"]
    model = load_cached(**a.session_state[MODEL]).model
    assert load_cached(**b.session_state[MODEL]).model is model  # one cached model for both sessions
    before = fingerprint(model)
    assert before["layer_idx"] == list(range(30)) and before["hooks"] == 0

    for name, at in sessions.items():  # interleaved: a calibrates, b calibrates, then both evaluate
        calibrate(at, *SESSIONS[name])
        no_exception(at)
        assert not errors(at)
        ill = [w.value for w in at.warning if "Ill-conditioned ghost fit" in w.value]  # 4 x 64 tokens < 576
        assert len(ill) == (1 if "ghost" in SESSIONS[name][1] else 0)
        assert all("[20, 22)" in w and "at least 2,304 calibration tokens" in w for w in ill)
    for at in sessions.values():
        evaluate(at)
        no_exception(at)
        assert not errors(at)

    for name, at in sessions.items():
        layers, methods = SESSIONS[name]
        run = run_of(at)
        assert run.layers == layers and run.methods == ["none", *methods]
        assert set(run.run.results) == {"none", *methods} and run.run.dropped == layers
        table = run_of(at).evaluation.table.frame().set_index("label")
        assert list(table.index) == ["dense", "pruned", *methods]
    table_a, table_b = (run_of(at).evaluation.table.frame().set_index("label") for at in (a, b))
    assert table_a.ppl["dense"] == pytest.approx(table_b.ppl["dense"], rel=1e-6)  # same model
    assert table_a.ppl["pruned"] != pytest.approx(table_b.ppl["pruned"], rel=1e-3)
    assert table_a["parameters (M)"]["pruned"] > table_b["parameters (M)"]["pruned"]  # 2 layers vs 3 gone

    for name, at in sessions.items():  # each Compare page shows its own run, after the other session ran
        layers, methods = SESSIONS[name]
        open_page(at, "compare")
        no_exception(at)
        assert any(f"Layers {', '.join(map(str, layers))} dropped" in c.value for c in at.caption)
        shown = next(d.value for d in at.dataframe if "ppl" in d.value.columns)
        assert list(shown.label) == ["dense", "pruned", *methods]
        assert list(shown.ppl) == pytest.approx(list(run_of(at).evaluation.table.frame().ppl))

    assert load_cached(**a.session_state[MODEL]).model is model  # still the same cached object
    assert fingerprint(model) == before
