"""The calibration statistics cache: reused only for the very same pass, bitwise equal, never fatal."""

from __future__ import annotations

import copy
import errno
import json
import os
import warnings
from dataclasses import replace

import pytest
import torch
import transformers as tf

from ghosted.calibration.collect import CalibrationConfig
from ghosted.cli import main
from ghosted.evaluation.perplexity import perplexity
from ghosted.experiments.run import run_experiment
from ghosted.experiments.spec import ExperimentSpec
from ghosted.models.pruning import prune
from ghosted.recovery.fitting import RecoveryConfig, recover
from ghosted.calibration import cache as stats_cache
from ghosted.calibration.cache import MARKER, StatsCache, model_identity, stats_dir
from ghosted.data.windows import TokenWindows
from tests.tiny import random_ids, tiny_model
from tests.tiny import CharTokenizer, loaded

# Every method whose fit needs no forward pass once the statistics are there (ghost-auto scores
# held-out windows, so it runs the model whatever the cache does).
NO_FORWARD_METHODS = ["none", "ghost", "ghost-robust", "replaceme-ls", "replaceme-ls-robust", "replaceme-cos",
                      "linearpatch-diag", "linearpatch-rotate"]


@pytest.fixture
def folder_model(tmp_path):
    """A tiny llama saved to a folder and loaded back, so it has an identity (the folder's files)."""
    folder = tmp_path / "tiny-llama"
    tiny_model("llama").save_pretrained(folder)
    model = tf.AutoModelForCausalLM.from_pretrained(folder)
    model.eval().requires_grad_(False)
    return model


def windows(seed: int = 0, n: int = 4, length: int = 16) -> TokenWindows:
    ids = random_ids(n, length, seed=seed)  # (n, length)
    return TokenWindows(ids, torch.ones_like(ids), {"source": "random", "seed": seed})


FIT, HELD = windows(0), windows(1, n=2)


def fit(model, cache, drop="2-3", methods=("none", "ghost"), config=None, calib=FIT, held=HELD):
    return recover(model, drop, list(methods), calib, held, config, cache=cache)


class ForwardForbidden:
    """Makes any forward pass of ``model`` raise while active (a pre-hook on its embedding)."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        def refuse(*_):
            raise AssertionError("the model ran a forward pass")
        self.handle = self.model.get_input_embeddings().register_forward_pre_hook(refuse)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


def test_second_call_reuses_without_a_forward_pass_and_is_bitwise_equal(folder_model, tmp_path):
    cache = StatsCache(tmp_path / "stats")
    plain = fit(folder_model, None, methods=NO_FORWARD_METHODS)  # no cache at all: the reference
    first = fit(folder_model, cache, methods=NO_FORWARD_METHODS)
    with ForwardForbidden(folder_model):
        second = fit(folder_model, cache, methods=NO_FORWARD_METHODS)
    assert first.statistics == {"calibration": "computed", "held-out": "computed"}
    assert second.statistics == {"calibration": "reused", "held-out": "reused"}
    assert {r.statistics for r in second.results.values()} == {"reused"}
    for method in NO_FORWARD_METHODS:
        for gap, op in plain.results[method].operators.items():
            assert torch.equal(op, second.results[method].operators[gap]), method
            assert torch.equal(op, first.results[method].operators[gap]), method
    for gap, stats in plain.results["none"].stats.items():
        reused = second.results["none"].stats[gap]
        assert torch.equal(stats.xtx, reused.xtx) and torch.equal(stats.sink.dtd, reused.sink.dtd)
        assert torch.equal(stats.position_dtd, reused.position_dtd) and stats.n_tokens == reused.n_tokens
    assert plain.sinks.equals(second.sinks)
    for method in ("ghost", "ghost-robust", "replaceme-ls"):
        a = perplexity(plain.results[method].model, FIT)
        b = perplexity(second.results[method].model, FIT)
        assert a.nll == b.nll  # bitwise: the same operators give the same numbers


def test_the_sink_norm_threshold_comes_back_with_the_statistics(folder_model, tmp_path):
    cache = StatsCache(tmp_path / "stats")
    config = lambda: RecoveryConfig(sink_norm_factor=1.5)  # noqa: E731  a fresh rule each call
    first = fit(folder_model, cache, methods=["ghost-robust"], config=config())
    second = fit(folder_model, cache, methods=["ghost-robust"], config=config())
    assert second.statistics["calibration"] == "reused"
    assert second.sinks.equals(first.sinks) and len(first.sinks)
    a = perplexity(first.results["ghost-robust"].model, HELD)
    b = perplexity(second.results["ghost-robust"].model, HELD)
    assert a.nll == b.nll  # the frozen threshold decides which tokens are sinks at inference


@pytest.mark.parametrize("change", ["windows", "mask", "gaps", "kinds", "batch", "seed", "sinks", "dtype", "mtime"])
def test_anything_that_changes_the_statistics_computes_them_again(folder_model, tmp_path, change):
    cache = StatsCache(tmp_path / "stats")
    assert fit(folder_model, cache).statistics["calibration"] == "computed"
    model, kwargs = folder_model, {}
    if change == "windows":
        kwargs["calib"] = windows(5)
    elif change == "mask":
        mask = FIT.attention_mask.clone()
        mask[0, -3:] = 0  # three padding tokens
        kwargs["calib"] = TokenWindows(FIT.input_ids, mask, FIT.protocol)
    elif change == "gaps":
        kwargs["drop"] = "2-4"
    elif change == "kinds":
        kwargs["methods"] = ["none", "ghost", "replaceme-ls"]  # ReplaceMe's MLP-branch sums too
    elif change in ("batch", "seed"):
        field = {"batch": "batch_size", "seed": "seed"}[change]
        value = 2 if change == "batch" else 7
        kwargs["config"] = RecoveryConfig(calibration=replace(CalibrationConfig(), **{field: value}))
    elif change == "sinks":
        kwargs["config"] = RecoveryConfig(sink_norm_factor=3.0)
    elif change == "dtype":
        model = copy.deepcopy(folder_model).to(torch.float64)
    elif change == "mtime":
        weights = os.path.join(folder_model.config._name_or_path, "model.safetensors")
        stat = os.stat(weights)
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the checkpoint was rewritten
    again = fit(model, cache, **kwargs)
    assert again.statistics["calibration"] == "computed"
    assert fit(model, cache, **kwargs).statistics["calibration"] == "reused"  # and saved under the new key


def test_no_cache_neither_reads_nor_writes(folder_model, tmp_path):
    folder = tmp_path / "stats"
    for _ in range(2):
        run = fit(folder_model, None)
        assert run.statistics["calibration"] == "computed"
    assert not folder.exists() and not any(stats_dir().glob("*.json"))
    cache = StatsCache(folder)
    fit(folder_model, cache)
    entries = len(list(folder.glob("*.json")))
    assert fit(folder_model, None).statistics["calibration"] == "computed"
    assert len(list(folder.glob("*.json"))) == entries == 2  # calibration and held-out passes


@pytest.mark.parametrize("damage", ["truncated tensors", "changed byte", "garbled json", "missing tensors",
                                    "wrong key"])
def test_a_damaged_entry_is_computed_again_with_a_warning(folder_model, tmp_path, damage):
    cache = StatsCache(tmp_path / "stats")
    first = fit(folder_model, cache)
    meta = sorted(cache.folder.glob("*.json"), key=lambda p: json.loads(p.read_text())["key"]["tokens"])[-1]
    tensors = meta.with_suffix(".safetensors")  # the calibration pass (more tokens than the held-out one)
    if damage == "truncated tensors":
        tensors.write_bytes(tensors.read_bytes()[:100])
    elif damage == "changed byte":
        data = bytearray(tensors.read_bytes())
        data[-8] ^= 0xFF
        tensors.write_bytes(bytes(data))
    elif damage == "garbled json":
        meta.write_text(meta.read_text()[:50])
    elif damage == "missing tensors":
        tensors.unlink()
    else:
        record = json.loads(meta.read_text())
        record["key"]["gaps"] = [[0, 1]]
        meta.write_text(json.dumps(record))
    with pytest.warns(RuntimeWarning, match="unreadable calibration statistics"):
        again = fit(folder_model, cache)
    assert again.statistics == {"calibration": "computed", "held-out": "reused"}
    assert torch.equal(again.results["ghost"].operators[next(iter(first.results["ghost"].operators))],
                       next(iter(first.results["ghost"].operators.values())))
    assert fit(folder_model, cache).statistics["calibration"] == "reused"  # rewritten whole


@pytest.mark.parametrize("failure", [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system")])
def test_a_failed_write_warns_once_and_leaves_no_partial_entry(folder_model, tmp_path, monkeypatch, failure):
    """A full disk or a read-only folder (simulated: root ignores chmod): one warning for both passes."""
    def failing(tensors, path, *args, **kwargs):
        with open(path, "wb") as handle:
            handle.write(b"partial")
        raise OSError(*failure)
    monkeypatch.setattr(stats_cache, "save_file", failing)
    cache = StatsCache(tmp_path / "stats")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = fit(folder_model, cache)
    said = [str(w.message) for w in caught if "calibration statistics" in str(w.message)]
    assert len(said) == 1 and "Could not save" in said[0] and failure[1] in said[0] and "in memory" in said[0]
    assert run.statistics == {"calibration": "computed", "held-out": "computed"} and run.results["ghost"].operators
    assert [p.name for p in cache.folder.iterdir()] == [MARKER]  # no temporary file, no half entry
    assert cache.written == [] and "not cached" in cache.failure


def test_a_run_whose_statistics_could_not_be_saved_never_says_they_are_cached(folder_model, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(stats_cache, "save_file", disk_full)
    with pytest.warns(RuntimeWarning, match="No space left"):
        report, _ = run_experiment(ExperimentSpec().with_options(**RUN), loaded=loaded(folder_model))
    assert any("not cached" in w for w in report["warnings"]) and report["complete"] is True
    real = stats_cache.collect_stats

    def second_pass_interrupted(*args, **kwargs):  # the calibration pass finishes, the held-out one is cut
        if kwargs.get("label") != "calibration":
            raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(stats_cache, "collect_stats", second_pass_interrupted)
    with pytest.warns(RuntimeWarning, match="No space left"), pytest.raises(KeyboardInterrupt) as caught:
        run_experiment(ExperimentSpec().with_options(**RUN, seed=5), loaded=loaded(folder_model))
    finished = caught.value.partial_report["stopped"]["finished"]
    assert "cached" not in finished and "no model fitted" in finished


def test_a_checkpoint_rewritten_in_place_with_its_times_kept_is_not_reused(tmp_path):
    """``cp -p`` / ``rsync -a`` over a model folder keep the modification times: other weights, same
    names, sizes and mtimes. The change time, inode and content samples still tell them apart."""
    folder = tmp_path / "tiny-llama"
    tiny_model("llama", seed=0).save_pretrained(folder)
    times = {p: p.stat() for p in folder.iterdir()}
    cache = StatsCache(tmp_path / "stats")
    first = fit(tf.AutoModelForCausalLM.from_pretrained(folder).eval(), cache)
    tiny_model("llama", seed=1).save_pretrained(folder)  # other weights, rewritten in place
    for path, stat in times.items():
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the times kept, as cp -p does
        assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    again = fit(tf.AutoModelForCausalLM.from_pretrained(folder).eval(), cache)
    assert again.statistics == {"calibration": "computed", "held-out": "computed"}
    gap = next(iter(first.results["none"].stats))
    assert not torch.equal(first.results["none"].stats[gap].xtx, again.results["none"].stats[gap].xtx)


def test_identity_samples_every_weight_file_and_reads_little(tmp_path):
    from ghosted.calibration.identity import HEADER_BYTES, SAMPLE_BYTES, SAMPLES, content_sample

    big = tmp_path / "model.safetensors"
    big.write_bytes(bytes(8 * 2**20))  # 8 MiB of zeros
    before = content_sample(big, big.stat().st_size)
    with open(big, "r+b") as handle:  # one byte changed where a sample lands
        handle.seek(HEADER_BYTES + (big.stat().st_size - HEADER_BYTES) * 3 // SAMPLES)
        handle.write(b"\x01")
    assert content_sample(big, big.stat().st_size) != before
    assert HEADER_BYTES + SAMPLES * SAMPLE_BYTES <= 2**17  # about 128 KiB read per weight file


# --- ownership: the cache deletes only what Ghosted wrote ----------------------------------------------

def foreign_files(folder):
    """A user's files in the cache folder, one with an entry-like name that Ghosted did not write."""
    folder.mkdir(parents=True, exist_ok=True)
    mine = {"notes.txt": b"mine", "settings.json": b"{}",
            "ab" * 16 + ".json": json.dumps({"key": {"not": "an entry of this name"}}).encode()}
    for name, data in mine.items():
        (folder / name).write_bytes(data)
    return mine


def test_clear_refuses_a_folder_ghosted_did_not_create(monkeypatch, tmp_path, capsys):
    folder = tmp_path / "my-files"
    mine = foreign_files(folder)
    monkeypatch.setenv("GHOSTED_STATS_CACHE", str(folder))
    assert main(["cache", "--clear"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Refusing to clear") and MARKER in err and err.count("\n") == 1
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == mine


def test_statistics_are_not_saved_into_a_folder_ghosted_did_not_create(folder_model, tmp_path):
    folder = tmp_path / "my-files"
    mine = foreign_files(folder)
    cache = StatsCache(folder)
    with pytest.warns(RuntimeWarning, match="not Ghosted's statistics cache"):
        assert fit(folder_model, cache).statistics["calibration"] == "computed"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == mine


def test_clear_and_eviction_remove_only_ghosteds_entries(folder_model, tmp_path, capsys, monkeypatch):
    cache = StatsCache(tmp_path / "stats")
    fit(folder_model, cache, drop="1")
    mine = foreign_files(cache.folder)  # added after Ghosted made the folder
    limited = StatsCache(cache.folder, limit_gb=1e-9)  # every older entry is beyond the limit
    fit(folder_model, limited, drop="2")
    assert len(limited.owned()) == 1  # the newest entry only
    assert {n: (cache.folder / n).read_bytes() for n in mine} == mine
    assert limited.others() == sorted(mine)
    monkeypatch.setenv("GHOSTED_STATS_CACHE", str(cache.folder))
    assert main(["cache", "--clear"]) == 0
    assert "3 other file(s) left" in capsys.readouterr().out
    assert sorted(p.name for p in cache.folder.iterdir()) == sorted([*mine, MARKER])


def test_an_older_ghosted_cache_without_a_marker_is_adopted(folder_model, tmp_path):
    cache = StatsCache(tmp_path / "stats")
    fit(folder_model, cache)
    (cache.folder / MARKER).unlink()  # as an older Ghosted left it: entries only
    fit(folder_model, cache, drop="1")
    assert (cache.folder / MARKER).exists() and len(cache.owned()) == 4


def test_identity_is_cheap_and_refuses_what_it_cannot_name(folder_model, monkeypatch, tmp_path):
    identity = model_identity(folder_model)
    assert [row[0] for row in identity["files"]] == ["config.json", "generation_config.json", "model.safetensors"]
    assert model_identity(tiny_model("llama")) is None  # built in memory: nothing to name it by
    assert model_identity(prune(folder_model, [2])) is None  # a ghosted view: not the checkpoint
    recovered = fit(folder_model, None).results["ghost"].model
    assert model_identity(recovered) is None
    hub = copy.deepcopy(tiny_model("llama"))
    hub.config._name_or_path, hub.config._commit_hash = "org/model", "abc123"
    assert model_identity(hub) == {"hub": "org/model", "revision": "abc123"}
    monkeypatch.setenv("GHOSTED_CACHE", str(tmp_path / "cache"))
    converted = tmp_path / "cache" / "models" / "0123456789abcdef"
    converted.mkdir(parents=True)
    hub.config._name_or_path = str(converted)
    assert model_identity(hub) == {"gguf_sha256": "0123456789abcdef"}  # the bundled GGUF's hash, not its files


RUN = dict(drop="2-3", methods=["dense", "none", "ghost", "replaceme-ls"], calib_seqs=4, seq_len=32, heldout_seqs=2,
           eval_tokens=64, eval_seq_len=32, batch_size=2, device="cpu", dtype="float32")


def test_run_entries_say_computed_then_reused_with_equal_perplexity(folder_model, monkeypatch):
    first, _ = run_experiment(ExperimentSpec().with_options(**RUN), loaded=loaded(folder_model))
    with monkeypatch.context() as patch:  # evaluation needs the model: forbid only the calibration passes
        patch.setattr(stats_cache, "collect_stats", lambda *a, **k: pytest.fail("calibration ran again"))
        second, _ = run_experiment(ExperimentSpec().with_options(**RUN), loaded=loaded(folder_model))
    status = lambda report: {e["method"]: e.get("statistics") for e in report["results"]}  # noqa: E731
    assert status(first) == {"dense": None, "none": "computed", "ghost": "computed", "replaceme-ls": "computed"}
    assert status(second) == {"dense": None, "none": "reused", "ghost": "reused", "replaceme-ls": "reused"}
    assert [e["ppl"] for e in first["results"]] == [e["ppl"] for e in second["results"]]
    third, _ = run_experiment(ExperimentSpec().with_options(**RUN, cache=False), loaded=loaded(folder_model))
    assert status(third)["ghost"] == "computed" and first["complete"] and third["config"]["cache"] is False


def test_cache_command_lists_and_clears(folder_model, capsys):
    assert main(["cache"]) == 0
    assert "0 entries" in capsys.readouterr().out
    fit(folder_model, True)
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and "tiny-llama (3 files)" in out and "[2, 4)" in out
    assert "64" in out and "32" in out  # tokens of the calibration (4 x 16) and held-out (2 x 16) passes
    assert main(["cache", "--clear"]) == 0
    assert "cleared" in capsys.readouterr().out
    assert [p.name for p in stats_dir().iterdir()] == [MARKER]  # the folder stays Ghosted's, empty
    assert main(["cache"]) == 0 and "0 entries" in capsys.readouterr().out


def test_export_after_run_reuses_the_runs_statistics(folder_model, monkeypatch):
    """``export --method ghost-auto`` builds its windows and settings as ``run`` does: no new pass."""
    from ghosted.calibration import cache as stats_cache
    from ghosted.data.windows import split_calibration
    from ghosted.data.windows import calibration_windows

    settings = {**RUN, "methods": ["dense", "none", "ghost-auto"]}
    run_experiment(ExperimentSpec().with_options(**settings), loaded=loaded(folder_model))
    calib = calibration_windows(CharTokenizer(), "bundled:news", 4 + 2, 32, 0)  # what cli/export.py does
    fit_windows, held = split_calibration(calib, 2)
    monkeypatch.setattr(stats_cache, "collect_stats", lambda *a, **k: pytest.fail("calibration ran again"))
    config = RecoveryConfig(calibration=CalibrationConfig(batch_size=2, seed=0))
    exported = recover(folder_model, "2-3", ["ghost-auto"], fit_windows, held, config, cache=True)
    assert exported.results["ghost-auto"].statistics == "reused"


def test_least_recently_used_entries_go_beyond_the_size_limit(folder_model, tmp_path):
    cache = StatsCache(tmp_path / "stats")
    fit(folder_model, cache, drop="1")
    one_run = sum(p.stat().st_size for p in cache.folder.iterdir())
    limited = StatsCache(cache.folder, limit_gb=1.2 * one_run / 2**30)  # room for one run's two entries
    fit(folder_model, limited, drop="2")  # the "1" entries are the oldest: they go
    assert len(list(cache.folder.glob("*.json"))) == 2
    assert fit(folder_model, limited, drop="2").statistics == {"calibration": "reused", "held-out": "reused"}
    assert fit(folder_model, limited, drop="1").statistics["calibration"] == "computed"


def test_other_model_code_computes_again(folder_model, tmp_path, monkeypatch):
    cache = StatsCache(tmp_path / "stats")
    fit(folder_model, cache)
    monkeypatch.setattr(torch, "__version__", "0.0-other")  # another torch may compute other numbers
    assert fit(folder_model, cache).statistics["calibration"] == "computed"
