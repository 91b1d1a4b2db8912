"""Shared fixtures: tiny random models of every supported family, and the bundled model once."""

from __future__ import annotations

import os
import tempfile

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
