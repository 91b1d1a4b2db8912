"""Model sources: local folder, .gguf file, hub id offline, bad paths; devices and dtypes."""

import pytest
import torch

from ghosted.models.assets import bundled_gguf_path
from ghosted.models.loading import (ModelLoadError, available_devices, gpu_count, load_model, resolve_device,
                                    resolve_dtype, source_kind)
from tests.tiny import tiny_model


def _model_folder(folder):
    """A tiny llama with a word-level tokenizer saved in ``folder``; returns the model."""
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = tiny_model("llama")
    model.save_pretrained(folder)
    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(96)} | {"[UNK]": 95}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="w2").save_pretrained(folder)
    return model


def test_load_local_folder(tmp_path):
    model = _model_folder(tmp_path)
    lm = load_model(str(tmp_path), dtype="float32")
    assert lm.kind == "folder" and lm.tokenizer.pad_token == "w2"
    ids = torch.tensor([[3, 4, 5]])
    torch.testing.assert_close(lm.model(ids).logits, model(ids).logits)
    half = load_model(str(tmp_path), dtype="bfloat16")
    assert next(half.model.parameters()).dtype == torch.bfloat16


def test_no_load_runs_kernels_from_the_hub(tmp_path, monkeypatch):
    """transformers would swap layers for hub kernels on a GPU (code no one asked for, offline errors):
    every load asks it not to: a folder, and a saved model's weights with and without a device map."""
    from transformers import AutoModelForCausalLM

    from ghosted.operators.checkpoint import _load_without_tokenizer

    asked, real = [], AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        asked.append(kwargs.get("use_kernels"))
        return real(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    _model_folder(tmp_path)
    load_model(str(tmp_path), dtype="float32")
    _load_without_tokenizer(tmp_path, "cpu", "float32", None)
    _load_without_tokenizer(tmp_path, "cpu", "float32", {"": "cpu"})
    assert asked == [False, False, False]


def test_gguf_file_is_converted_once_and_cached(bundled):
    path = bundled_gguf_path()
    assert source_kind(str(path)) == "gguf"
    lm = load_model(str(path))
    assert lm.extra["location"] == bundled.extra["location"]  # same sha256, same cached folder
    assert lm.load_seconds < 60


def test_hub_id_offline_says_how_to_use_a_local_folder(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="local-dir"):
        load_model("some-org/some-model-that-is-not-cached")


def test_bad_paths_get_clear_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="No such model folder"):
        source_kind("./does/not/exist")
    text = tmp_path / "notes.txt"
    text.write_text("hi")
    with pytest.raises(ModelLoadError, match="not a .gguf"):
        source_kind(str(text))


def test_device_and_dtype_resolution():
    assert resolve_device("auto") in ("cpu", "cuda", "mps")
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    with pytest.raises(ModelLoadError, match="Unknown dtype"):
        resolve_dtype("float8")
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="no CUDA GPU"):
            resolve_device("cuda")


def test_the_devices_offered_are_those_this_machine_has():
    found = available_devices()
    assert found[:2] == ["auto", "cpu"] and resolve_device("auto") in [*found, "cuda"]
    assert gpu_count() == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert len([d for d in found if d.startswith("cuda")]) == gpu_count()
