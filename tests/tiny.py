"""Tiny random causal LMs of each supported family, built offline in milliseconds."""

from __future__ import annotations

import torch
import transformers as tf

VOCAB = 96
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma3", "phi3", "olmo2", "gpt2", "gpt_neox", "opt"]


def tiny_config(family: str, layers: int = 6):
    """A valid config with a 32-wide residual stream and ``layers`` decoder layers."""
    common = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=128, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    if family == "llama":
        return tf.LlamaConfig(**common, num_key_value_heads=2)
    if family == "mistral":
        return tf.MistralConfig(**common, num_key_value_heads=2, sliding_window=8)
    if family == "qwen2":  # sliding window on the upper layers: layer_types are not uniform
        return tf.Qwen2Config(**common, num_key_value_heads=2, use_sliding_window=True,
                              sliding_window=8, max_window_layers=layers // 2)
    if family == "qwen3":
        return tf.Qwen3Config(**common, num_key_value_heads=2, head_dim=8)
    if family == "gemma3":  # alternating sliding / full attention layers
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        return tf.Gemma3TextConfig(**common, num_key_value_heads=2, head_dim=8, sliding_window=8,
                                   layer_types=types)
    if family == "phi3":
        return tf.Phi3Config(**common, num_key_value_heads=2)
    if family == "olmo2":
        return tf.Olmo2Config(**common, num_key_value_heads=2)
    if family == "gpt2":
        return tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=layers, n_head=4, n_positions=128,
                             bos_token_id=1, eos_token_id=2)
    if family == "gpt_neox":
        return tf.GPTNeoXConfig(**common)
    if family == "opt":
        return tf.OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=layers,
                            num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32,
                            max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    raise KeyError(family)


def tiny_model(family: str, layers: int = 6, seed: int = 0):
    """A tiny random model in eval mode (weights scaled up a little so layers matter)."""
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(tiny_config(family, layers))
    model.eval()
    model.requires_grad_(False)
    return model


def random_ids(batch: int = 2, length: int = 16, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=gen)


class CharTokenizer:
    """Characters to ids 3..VOCAB-1, no BOS: enough for ghosted.data.sources's windows on a tiny model."""

    name_or_path = "char-tokenizer"
    bos_token_id = None

    def __len__(self) -> int:
        return VOCAB

    def __call__(self, text: str, **_) -> dict:
        return {"input_ids": [3 + ord(c) % (VOCAB - 3) for c in text]}

    def encode(self, text: str) -> list[int]:
        return self(text)["input_ids"]


def tiny_loaded(layers: int = 8):
    """A tiny Llama with the character tokenizer, as a LoadedModel."""
    from ghosted.models.loading import LoadedModel

    return LoadedModel(tiny_model("llama", layers=layers), CharTokenizer(), "tiny", "folder", "cpu", "float32", 0.0)


def small_config(**overrides):
    """A small grid on a tiny model: two block sizes, a few short windows."""
    from ghosted.grid.run import GridConfig

    base = dict(n_values=[2, 3], calib_seqs=6, seq_len=32, heldout_seqs=2, eval_tokens=96, eval_seq_len=32,
                batch_size=2, device="cpu", dtype="float32")
    return GridConfig.of(**{**base, **overrides})


def loaded(model):
    """Any tiny model with the character tokenizer, as a LoadedModel from a folder."""
    from ghosted.models.loading import LoadedModel

    return LoadedModel(model, CharTokenizer(), model.config._name_or_path, "folder", "cpu", "float32", 0.0)


def tiny_model_folder(folder):
    """A tiny Llama saved with a word-level tokenizer in ``folder``: the command line loads and
    calibrates it in a second, in this process or in a new one."""
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = Path(folder)
    tiny_model("llama").save_pretrained(folder)
    raw = Tokenizer(models.WordLevel({f"w{i}": i for i in range(95)} | {"[UNK]": 95}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="w2").save_pretrained(folder)
    return folder
