"""The experiment-spec parser, for any JSON: a spec whose every field has its flag's type and choice, or a
ValueError/TypeError with a message. Then the same for real recipe files mutated byte by byte and field by
field (``load_spec``), and for ``run --recipe FILE --dry-run`` (exit 0 or one line and exit 2)."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from ghosted.cli import main
from ghosted.experiments.spec import ExperimentSpec, _leaves
from ghosted.experiments.spec_files import load_spec
from tests.properties import assert_refusal, bounded_memory, examples

REFUSALS = (ValueError, TypeError, FileNotFoundError)
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**70), st.floats(), st.text(max_size=12),
                   st.sampled_from(["no", "false", "true", "0", "32", "paralel", "../../etc/passwd", "/dev/zero",
                                    "independent", "dense,ghost", "bundled:wiki"]))
JSON = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                    st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=12)
TYPES = {"bool": (bool,), "int": (int,), "float": (float,), "str": (str,), "list[str]": (list,)}


def real_spec() -> dict:
    """A spec a real run writes, with a value other than the default in every section."""
    return ExperimentSpec().with_options(
        model="some/model", device="cpu", dtype="float32", calib="bundled:wiki", calib_seqs=7, seq_len=48,
        heldout_seqs=3, seed=5, batch_size=2, cache=False, eval="bundled:news", eval_tokens=999, eval_seq_len=33,
        tasks=["bundled-lastword"], task_limit=20, drop="3,5-6", methods=["dense", "ghost"], ghost_mode="sequential",
        granularity="layer", eps=0.25, solver="pinv", rank=12, fold=False).to_dict()


def assert_valid_spec(spec: ExperimentSpec) -> None:
    """Every field has its flag's type (None only where the default allows it) and its choice."""
    from ghosted.experiments.spec import _called

    for path, f in _leaves(ExperimentSpec):
        value = spec
        for name in path:
            value = getattr(value, name)
        if value is None:
            assert "None" in f.type, path
            continue
        kind = f.type.replace(" | None", "")
        assert isinstance(value, TYPES[kind]) and (kind == "bool" or not isinstance(value, bool)), (path, value)
        if kind == "list[str]":
            assert all(isinstance(item, str) for item in value), (path, value)
        choices = _called(f.metadata.get("choices"))
        if choices and value != "":
            assert value in choices, (path, value)
    assert spec.model.trust_remote_code is False  # never from a file


def parsed(data):
    with bounded_memory():
        try:
            return ExperimentSpec.from_dict(data)
        except REFUSALS as err:
            return err


def check(out) -> None:
    if isinstance(out, BaseException):
        assert_refusal(out, REFUSALS)
    else:
        assert_valid_spec(out)


@examples("spec_dict_any_json")
@given(JSON)
@example({"spec_version": True})
@example({"calibration": [1, 2]})
def test_any_json_is_a_valid_spec_or_a_refusal(data):
    check(parsed(data))


LEAVES = [path for path, _ in _leaves(ExperimentSpec)]
SECTIONS = ["model", "calibration", "evaluation", "layers", "recovery", "methods", "spec_version"]


@examples("spec_dict_one_leaf_changed")
@given(st.sampled_from(LEAVES + [(name,) for name in SECTIONS]), JSON)
@example(("calibration", "cache"), "no")
@example(("recovery", "fold"), "false")
@example(("calibration", "calib_seqs"), "32")
@example(("calibration", "calib_seqs"), None)
@example(("recovery", "ghost_mode"), "paralel")
@example(("model", "trust_remote_code"), True)
def test_a_real_spec_with_any_field_changed_is_a_valid_spec_or_a_refusal(path, value):
    data = real_spec()
    where = data
    for name in path[:-1]:
        where = where[name]
    where[path[-1]] = value
    out = parsed(data)
    check(out)
    if path == ("model", "trust_remote_code") and not isinstance(out, BaseException):
        assert out.model.trust_remote_code is False


def mutated_bytes(data: bytes, draw) -> bytes:
    """The bytes of a real file, truncated, with bits flipped, or with a span replaced."""
    how = draw(st.sampled_from(["truncate", "flip", "splice"]))
    if how == "truncate":
        return data[:draw(st.integers(0, len(data)))]
    out = bytearray(data)
    if how == "flip":
        for _ in range(draw(st.integers(1, 8))):
            out[draw(st.integers(0, len(out) - 1))] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    start = draw(st.integers(0, len(out)))
    return bytes(out[:start]) + draw(st.binary(max_size=16)) + bytes(out[start + draw(st.integers(0, 16)):])


def real_recipe_files() -> dict[str, bytes]:
    """A results JSON (``run --out``) and a saved folder's recipe, as a real run writes them."""
    spec = real_spec()
    return {"results.json": json.dumps({"spec": spec, "complete": True, "results": {}}, indent=2).encode(),
            "ghosted_recipe.json": json.dumps({"format": "ghosted-recipe", "format_version": 2, "spec": spec,
                                               "operator_files": []}, indent=2).encode()}


@examples("spec_file_mutated")
@given(st.sampled_from(sorted(real_recipe_files())), st.data())
def test_a_mutated_recipe_file_loads_as_a_valid_spec_or_is_refused(name, data):
    content = mutated_bytes(real_recipe_files()[name], data.draw)
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / name
        file.write_bytes(content)
        with bounded_memory():
            try:
                out = load_spec(file)
            except REFUSALS as err:
                out = err
    check(out)


@examples("cli_recipe_mutated")
@given(st.sampled_from([p for p in LEAVES if p[0] != "model"]), JSON)
@example(("calibration", "calib_seqs"), "32")
@example(("evaluation", "source"), "/dev/zero")
def test_run_recipe_dry_run_exits_0_or_2_with_one_line(path, value):
    """A colleague's recipe with any field changed: the command line plans it or refuses it in one line."""
    data = real_spec()
    data["model"]["source"] = "bundled:smollm2-135m-instruct"
    data["calibration"]["source"] = data["evaluation"]["source"] = "bundled:wiki"
    data["evaluation"]["tasks"] = []
    data["layers"]["drop"] = "3,5-6"
    where = data
    for name in path[:-1]:
        where = where[name]
    where[path[-1]] = value
    err = io.StringIO()
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(err):
        file = Path(folder) / "results.json"
        file.write_text(json.dumps({"spec": data}))
        code = main(["run", "--recipe", str(file), "--dry-run"])
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error:")]
    assert (code, lines) == (0, []) or (code == 2 and len(lines) == 1), (code, err.getvalue()[-2000:])
    assert "Traceback" not in err.getvalue()
