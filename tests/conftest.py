"""Shared fixtures: tiny random models of every supported family, and the bundled model once."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Calibration statistics saved by the tests (and by app servers they start) never reach the user's
# cache; the bundled model's converted copy stays where it is ($GHOSTED_CACHE is left alone).
os.environ.setdefault("GHOSTED_STATS_CACHE", tempfile.mkdtemp(prefix="ghosted-test-stats-"))
os.environ.setdefault("GHOSTED_RESULTS", tempfile.mkdtemp(prefix="ghosted-test-results-"))  # the app's shared store

import pytest
import torch

from tests.tiny import tiny_model  # noqa: E402


# Test tiers, by folder: `pytest -m unit` is the fast tier for development; plain `pytest` (the README's
# command and CI) runs every tier. A unit test marked slow stays out of the unit tier.
TIERS = {"app": "app", "e2e": "e2e", "gpu": "gpu", "unit": "unit"}  # folder under tests/ -> marker


def pytest_collection_modifyitems(config, items):
    """Mark each test with the tier of its folder (tests/unit -> unit unless it is marked slow).

    A unit test that asks for the bundled model (the `bundled` fixture, directly or through another
    fixture) is marked slow here."""
    root = config.rootpath / "tests"
    for item in items:
        try:
            folder = item.path.relative_to(root).parts[0]
        except ValueError:  # a test outside tests/
            continue
        tier = TIERS.get(folder)
        if tier == "unit" and "bundled" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        if tier is None or (tier == "unit" and item.get_closest_marker("slow")):
            continue
        item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def bundled():
    """The bundled SmolLM2 model, loaded once per test session; treat it as read-only."""
    from ghosted.models.loading import load_model

    return load_model()


@pytest.fixture
def tiny_llama():
    return tiny_model("llama")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _fresh_stats_cache(tmp_path_factory, monkeypatch):
    """Each test starts with an empty statistics cache of its own."""
    monkeypatch.setenv("GHOSTED_STATS_CACHE", str(tmp_path_factory.mktemp("stats")))


from tests.guard.sitecustomize import refusing_the_bundled_gguf  # noqa: E402

GUARD_SITE = Path(__file__).parent / "guard"  # sitecustomize.py: the guard for the processes a test starts


@pytest.fixture(autouse=True)
def _bundled_only_when_slow(request, monkeypatch):
    """The fast tier never loads the bundled model: a unit test not marked slow that does fails.

    In this process ``load_model`` asks ``bundled_gguf_path`` for the GGUF, which fails the test here (so
    does converting the bundled GGUF given by its path, as a ``.gguf`` source); in a Python process the
    test starts (a CLI run), ``tests/guard/sitecustomize.py`` does the same and exits with code 86.
    Tests that use the `bundled` fixture are marked slow at collection, so they never get here.
    """
    if request.node.get_closest_marker("unit") is None or request.node.get_closest_marker("slow"):
        return
    from ghosted.models import loading

    def refuse(*_args, **_kwargs):
        pytest.fail("this test loads the bundled model: use the `bundled` fixture or mark it slow", pytrace=False)

    monkeypatch.setattr(loading, "_gguf_to_safetensors", refusing_the_bundled_gguf(loading, refuse))
    monkeypatch.setattr(loading, "bundled_gguf_path", refuse)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(GUARD_SITE), os.environ.get("PYTHONPATH")) if p))
