"""Shared fixtures: tiny random models of every supported family, and the bundled model once."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

from tests.tiny import tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def bundled():
    """The bundled SmolLM2 model, loaded once per test session; treat it as read-only."""
    from ghosted.loading import load_model

    return load_model()


@pytest.fixture
def tiny_llama():
    return tiny_model("llama")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
