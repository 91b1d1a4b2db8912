"""The queue as sessions see it: a waiting page shows its place and what runs, identical requests of two sessions
share one job and one result, a job can be cancelled, a released result comes back, and a link reopens a run.

Two AppTest instances in one process are two sessions of one server (the queue and the store are process-wide).
Jobs are held at a gate where a test needs to see them waiting (``async_jobs``): no timing is assumed.
"""

from __future__ import annotations

import threading

import pytest
from streamlit.testing.v1 import AppTest

from ghosted.service import workbench as wb
from pages import _restore, _ui
from tests.app.conftest import ROOT, TIMEOUT, errors, figures, influence_of, no_exception, open_page, run_of

WAIT = 600  # seconds a test waits for a job (the CPU is shared); never reached when the queue works


@pytest.fixture(autouse=True)
def _own_backend(fresh_backend):
    """Every test here starts from an empty queue and store (the same small request recurs)."""


def session(monkeypatch) -> AppTest:
    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    monkeypatch.delenv("GHOSTED_DEPLOY", raising=False)
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()


def small_influence(at: AppTest) -> AppTest:
    """The Influence form with a small, quick measurement (the same in every session)."""
    open_page(at, "influence")
    at.number_input(key="influence_calib_seqs").set_value(4)
    at.number_input(key="influence_seq_len").set_value(32)
    at.multiselect(key="influence_metrics").set_value(["block_influence"])
    return at


def panel_texts(at: AppTest) -> list[str]:
    return [p.proto.text for p in at.get("progress")]


@pytest.fixture
def gate(monkeypatch):
    """Influence jobs wait at this gate before computing."""
    opened, compute = threading.Event(), wb.InfluenceRequest.compute

    def held(self, lm, progress=None):
        while not opened.wait(0.05):
            if progress is not None:
                progress("held by the test", 0, 1)  # where a cancelled job stops
        return compute(self, lm, progress)

    monkeypatch.setattr(wb.InfluenceRequest, "compute", held)
    return opened


@pytest.mark.async_jobs
def test_two_sessions_share_one_job_and_see_it_while_it_runs(monkeypatch, gate):
    a, b = session(monkeypatch), session(monkeypatch)
    small_influence(a).button(key="influence_run").click().run()
    no_exception(a)
    (text,) = panel_texts(a)
    assert "Measuring layer influence" in text and ("running" in text or "place 1" in text)
    assert any(button.key.startswith("cancel_") for button in a.button)
    assert a.button(key="influence_run").disabled  # no second click while it runs

    small_influence(b).button(key="influence_run").click().run()
    (text,) = panel_texts(b)
    assert "shared with 1 other session" in text
    key = b.session_state[_ui.INFLUENCE].key()
    assert key == a.session_state[_ui.INFLUENCE].key()

    gate.set()
    assert _ui.backend().wait(key, WAIT).state == "done"
    for at in (a, b):
        at.run()
        no_exception(at)
        assert not panel_texts(at) and not errors(at)
        assert any("Block Influence" in str(f) for f in figures(at)) or figures(at)
    assert influence_of(a) is influence_of(b)  # one result, shared (read-only)


@pytest.mark.async_jobs
def test_the_page_log_records_what_each_waiting_session_was_told(monkeypatch, gate, tmp_path):
    """What the load benchmark reads: each ask, each panel (with its place) and the first answer, by owner."""
    import json

    log = tmp_path / "pages.jsonl"
    monkeypatch.setenv("GHOSTED_PAGE_LOG", str(log))
    at = session(monkeypatch)
    small_influence(at).button(key="influence_run").click().run()
    key = at.session_state[_ui.INFLUENCE].key()
    gate.set()
    assert _ui.backend().wait(key, WAIT).state == "done"
    at.run()
    at.run()  # a second look at the result is not a second answer
    events = [e for e in map(json.loads, log.read_text().splitlines()) if e.get("key") == key]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "asked" and "panel" in kinds and kinds.count("answered") == 1
    assert kinds.index("panel") < kinds.index("answered")
    assert len({e["owner"] for e in events}) == 1 and all(e["time"] > 0 for e in events)
    panel = next(e for e in events if e["event"] == "panel")
    assert panel["state"] in ("queued", "running") and panel["kind"] == "influence"
    assert (panel["position"] >= 1) == (panel["state"] == "queued")


@pytest.mark.async_jobs
def test_a_waiting_session_can_cancel(monkeypatch, gate):
    at = session(monkeypatch)
    small_influence(at).button(key="influence_run").click().run()
    key = at.session_state[_ui.INFLUENCE].key()
    next(button for button in at.button if button.key == f"cancel_{key}").click().run()
    said = [i.value for i in at.info]  # a queued job ends at once, a running one at its next progress call
    assert _ui.backend().wait(key, WAIT).state == "cancelled"
    at.run()
    no_exception(at)
    assert any("cancelled" in text for text in said + [i.value for i in at.info])
    assert not panel_texts(at) and not at.button(key="influence_run").disabled
    assert influence_of(at) is None


def test_a_released_result_comes_back_from_disk_or_is_computed_again(monkeypatch):
    at = session(monkeypatch)
    small_influence(at).button(key="influence_run").click().run()
    at.multiselect(key="influence_layers").set_value([20, 21]).run()
    open_page(at, "recover")
    for key, value in (("calib_seqs", 4), ("seq_len", 64), ("heldout_seqs", 2)):
        at.number_input(key=key).set_value(value)
    at.multiselect(key="methods").set_value(["ghost"])
    at.button(key="calibrate_run").click().run()
    first = run_of(at)
    assert first is not None and first.layers == [20, 21]

    store = _ui.backend().store
    for name in (_ui.INFLUENCE, _ui.RUN):  # what an idle session's results go through (idle_release_s)
        store.forget(at.session_state[name].key())
    open_page(at, "influence")
    no_exception(at)
    assert influence_of(at) is not None and figures(at)  # the report's JSON copy on disk
    open_page(at, "recover")
    no_exception(at)
    again = run_of(at)  # fitted again (the job queue, the same request)
    assert again is not first and again.layers == [20, 21]
    assert again.frames["errors"].error.tolist() == pytest.approx(first.frames["errors"].error.tolist())


def test_a_link_reopens_the_run_and_the_compare_page_gives_it(monkeypatch):
    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    monkeypatch.delenv("GHOSTED_DEPLOY", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    at.query_params.update({"layers": "20-21", "methods": "ghost", "n": "4", "len": "64", "heldout": "2",
                            "tokens": "256", "window": "128"})
    at.run()
    no_exception(at)
    assert at.session_state[_ui.SELECTION] == [20, 21]
    fitted = run_of(at)
    assert fitted.methods == ["none", "ghost"] and fitted.evaluation is not None
    assert fitted.evaluation.table.labels == ["dense", "pruned", "ghost"]
    open_page(at, "compare")
    no_exception(at)
    (link,) = [c.value for c in at.code if "layers=" in c.value]
    assert "layers=20-21" in link and "methods=ghost" in link and "tokens=256" in link


def test_a_bad_link_says_why_and_leaves_the_session_usable(monkeypatch):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    at.query_params.update({"layers": "20-21", "methods": "ghost,rm"})
    at.run()
    no_exception(at)
    assert any("This link could not be opened" in e and "unknown methods" in e for e in errors(at))
    assert at.session_state[_ui.SELECTION] == [] and _ui.RUN not in at.session_state


@pytest.mark.parametrize("deploy", ["local", "demo"])
def test_a_link_with_windows_beyond_the_models_positions_is_refused_before_anything_is_queued(monkeypatch, deploy):
    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    monkeypatch.setenv("GHOSTED_DEPLOY", deploy)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    at.query_params.update({"layers": "20-21", "tokens": "8192", "window": "32768"})
    at.run()
    no_exception(at)
    why = "eval_seq_len (--eval-seq-len) = 32768 is longer than this model's 8192 positions"
    assert any("This link could not be opened" in e and why in e for e in errors(at)), errors(at)
    assert _ui.RUN not in at.session_state and _ui.EVALUATION not in at.session_state


def test_a_link_shows_its_settings_in_the_forms_of_its_pages(monkeypatch):
    monkeypatch.delenv("GHOSTED_DEMO", raising=False)
    monkeypatch.delenv("GHOSTED_DEPLOY", raising=False)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    at.query_params.update({"layers": "20-21", "methods": "ghost", "n": "4", "len": "64", "heldout": "2",
                            "seed": "3", "mode": "sequential", "calib": "bundled:wiki",
                            "tokens": "256", "window": "128"})
    at.run()
    no_exception(at)
    open_page(at, "recover")
    no_exception(at)
    asked = {key: at.number_input(key=key).value for key in ("calib_seqs", "seq_len", "heldout_seqs", "seed")}
    assert asked == {"calib_seqs": 4, "seq_len": 64, "heldout_seqs": 2, "seed": 3}
    assert at.multiselect(key="methods").value == ["ghost"]
    assert at.radio(key="ghost_mode").value == "sequential" and at.radio(key="calib_kind").value == "bundled:wiki"
    assert not [w.proto.body for w in at.warning if "Session State API" in w.proto.body]
    open_page(at, "compare")
    no_exception(at)
    assert (at.number_input(key="eval_tokens").value, at.number_input(key="eval_seq_len").value) == (256, 128)
    open_page(at, "recover")  # shown once: the user's own changes are not overwritten on return
    at.number_input(key="calib_seqs").set_value(8).run()
    open_page(at, "compare")
    open_page(at, "recover")
    assert _restore.FORM in at.session_state and not at.session_state[_restore.FORM]


def test_the_server_warms_the_precomputed_runs_and_a_session_gets_the_warm_one(monkeypatch, tmp_path):
    listed = tmp_path / "class.toml"
    listed.write_text('[[experiment]]\nlayers = "20-21"\nmethods = ["ghost"]\n')
    monkeypatch.setenv("GHOSTED_PRECOMPUTE_LIST", str(listed))
    monkeypatch.setattr(_ui, "_WARMED", False)
    at = session(monkeypatch)  # the server's first page queues the list's fit
    no_exception(at)
    warm = wb.FitRequest(model=_ui.current_key(), layers=(20, 21), methods=("ghost",))
    assert _ui.backend().status(warm.key(), _ui.WARM_OWNER) is not None
    assert _ui.backend().wait(warm.key(), timeout=WAIT).state == "done"
    fitted = _ui.backend().store.get(warm.key())

    other = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    other.query_params.update({"layers": "20-21", "methods": "ghost"})  # the same run, by a link
    other.run()
    no_exception(other)
    assert run_of(other).run is fitted.run  # the warm result itself: nothing fitted again
    session(monkeypatch)  # a second server page does not queue it again
    assert _ui.backend().status(warm.key(), _ui.WARM_OWNER).state == "done"


def test_a_dropped_connection_keeps_the_visitors_jobs_and_an_expired_session_gives_them_up(monkeypatch):
    """``session_alive`` asks the runtime's session manager for every session it still knows: connected, or
    disconnected and kept for a reconnect (Streamlit's storage of dropped sessions); only a forgotten
    session is gone."""
    from types import SimpleNamespace

    from streamlit.runtime import Runtime

    known = {"connected": "info", "dropped": "kept for a reconnect"}  # what get_session_info answers
    manager = SimpleNamespace(get_session_info=known.get, is_active_session=lambda sid: sid == "connected")
    with monkeypatch.context() as patched:  # undone before the caches are cleared at teardown
        patched.setattr(Runtime, "exists", staticmethod(lambda: True))
        patched.setattr(Runtime, "instance", staticmethod(lambda: SimpleNamespace(_session_mgr=manager)))
        assert _ui.session_alive("connected/abc") and _ui.session_alive("dropped/abc")  # a 3-second drop keeps it
        assert not _ui.session_alive("expired/abc") and _ui.session_alive(_ui.WARM_OWNER)
