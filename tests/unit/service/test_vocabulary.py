"""One vocabulary: a setting of the experiment is called by the spec's flat name everywhere it is taken.

The API's keywords (``ghosted.fit``, ``ghosted.run``), the app's requests (``workbench``), the deployment's
calibration check and the links' fields speak the spec's flat names (``calib_seqs``, ``heldout_seqs``,
``ghost_mode``, ``fold``, ``batch_size``, ``eval_tokens``, ...); validate's messages take each flag from the
spec's metadata. A name that is no spec setting is listed below with the reason it stands apart.

``ghosted.calibrate`` and ``ghosted.evaluate`` take the same names (``calib_seqs``, ``seq_len``,
``eval_tokens``, ``eval_seq_len``; their former ``n_seqs``, ``tokens`` and ``seq_len`` are read with a
DeprecationWarning), and the nested spec fields are the flat names too (a section's text is its ``source``).
Not checked here, on purpose: ``ghosted.data.windows`` draws any windows (calibration, held-out, evaluation),
so its arguments name windows, not a setting.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

import ghosted
from ghosted.service import links
from ghosted.experiments import validate
from ghosted.service import workbench as wb
from ghosted.service.deploy import DeployConfig
from ghosted.experiments.spec import FORMER_NAMES, ExperimentSpec, flat_flags
from tests.tiny import tiny_model

ROOT = Path(__file__).resolve().parents[3]
FLAT = set(ExperimentSpec().options())

NOT_SETTINGS = {  # keyword or field -> why it is no spec setting
    "spec": "ghosted.run's whole spec, which the settings change",
    "progress": "a callback, not a setting",
    "windows": "ghosted.fit's calibration windows given instead of drawn (the spec's calib names a text)",
    "heldout": "ghosted.fit's held-out windows given beside them (their number is heldout_seqs)",
    "tokenizer": "ghosted.calibrate's tokenizer (or LoadedModel)",
    "data": "ghosted.evaluate's windows, or the tokenizer to draw them with",
    "source": "the text ghosted.calibrate / ghosted.evaluate read (the spec's calib / eval)",
    "calibration_source": "the calibration text ghosted.evaluate splits its source against (the spec's calib)",
    "text": "a request's text: a source name or an uploaded TextSource (the spec's calib/eval are names)",
    "layers": "the layers a request drops, as numbers (the spec's drop is their text, '20-26')",
    "fit": "the run a measurement is made on (a nested request)",
    "rec_n": "the Influence page's block sizes, an influence criterion's setting (not a run's)",
    "metrics": "the Influence page's criteria (not a run's)",
    "prompts": "the Compare page's prompts, generation input",
    "new_tokens": "tokens generated per prompt, a generation setting (not a run's)",
    "chat": "the chat template switch of generation (not a run's)",
}
SAME_NAME_OTHER_FORM = {  # spec names a keyword or field takes in another form, with the same meaning
    ("fit", "model"): "the model itself (a LoadedModel or module) instead of its source",
    ("run", "model"): "the model's source, or a LoadedModel instead of it",
    ("evaluate", "model"): "the model itself (a LoadedModel or module) instead of its source",
    ("FitRequest", "model"): "the loaded model's key (its source, dtype and device)",
    ("InfluenceRequest", "model"): "the loaded model's key",
    ("FitRequest", "methods"): "the recovery methods; 'dense' and 'none' are always added",
    ("fit", "drop"): "also a list of layer indices",
}


def _keywords(function) -> list[str]:
    """Named parameters (``**settings`` aside: those go through the spec, which refuses any other name)."""
    return [p.name for p in inspect.signature(function).parameters.values()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _requests() -> list[type]:
    return [c for c in vars(wb).values() if isinstance(c, type) and issubclass(c, wb._Request)
            and c is not wb._Request and c.__module__ == wb.__name__]


def _strays(names, owner: str) -> list[str]:
    return [f"{owner}.{n}" for n in names if n not in FLAT and n not in NOT_SETTINGS]


@pytest.mark.parametrize("function", [ghosted.fit, ghosted.run], ids=["fit", "run"])
def test_the_api_keywords_are_the_specs_names(function):
    assert not _strays(_keywords(function), function.__name__)
    shared = {name for owner, name in SAME_NAME_OTHER_FORM if owner == function.__name__} | {"methods"}
    assert set(_keywords(function)) & FLAT <= shared  # no keyword takes a setting's name for something else


@pytest.mark.parametrize("function, settings", [
    (ghosted.calibrate, {"calib_seqs", "seq_len", "seed"}),
    (ghosted.evaluate, {"eval_tokens", "eval_seq_len", "batch_size"}),
], ids=["calibrate", "evaluate"])
def test_the_window_functions_take_the_settings_by_the_specs_names(function, settings):
    assert not _strays(_keywords(function), function.__name__)
    other_form = {name for owner, name in SAME_NAME_OTHER_FORM if owner == function.__name__}
    assert set(_keywords(function)) & FLAT - other_form == settings  # each meant as the spec means it


@pytest.mark.parametrize("call, old, new", [
    (lambda: ghosted.calibrate(tiny_model("llama"), n_seqs=0), "calibrate(n_seqs", "calib_seqs"),
    (lambda: ghosted.evaluate(tiny_model("llama"), tiny_model("llama"), tokens=0), "evaluate(tokens", "eval_tokens"),
])
def test_a_former_keyword_of_the_api_is_read_with_a_deprecation_warning(call, old, new):
    with pytest.warns(DeprecationWarning, match=rf"{re.escape(old)}=\.\.\.\) is now {new}"), \
            pytest.raises((ValueError, TypeError), match=new):
        call()  # read under the new name: the value 0 is refused by that name


def test_a_setting_passed_to_fit_by_its_name_reaches_the_spec():
    """``calib`` is the text windows are drawn from (the spec's), never the windows themselves."""
    with pytest.raises(TypeError, match="Without `windows`"):  # taken as the setting: drawing needs a tokenizer
        ghosted.fit(tiny_model("llama"), "2-3", calib="bundled:wiki", methods=["ghost"])
    with pytest.raises(TypeError, match="mode is now ghost_mode"):
        ghosted.fit(tiny_model("llama"), "2-3", mode="sequential")


def test_every_request_field_that_is_a_setting_has_the_specs_name():
    strays = [s for request in _requests() for s in _strays([f.name for f in fields(request)], request.__name__)]
    assert not strays, f"{strays}: use the spec's flat name, or list it in NOT_SETTINGS with the reason"
    assert wb.FitRequest in _requests() and wb.EvalRequest in _requests() and wb.ZeroShotRequest in _requests()
    assert "heldout_seqs" in FLAT and isinstance(inspect.getattr_static(wb.InfluenceRequest, "heldout_seqs"), property)
    assert set(wb.SPEC_SETTINGS) <= FLAT & {f.name for f in fields(wb.FitRequest)}


def test_the_exceptions_are_few_and_do_not_shadow_a_setting():
    assert not set(NOT_SETTINGS) & FLAT  # a spec name is never "no setting"
    assert all(name in FLAT for _, name in SAME_NAME_OTHER_FORM)


def test_the_deployments_calibration_check_and_the_links_speak_the_specs_names():
    assert set(_keywords(DeployConfig.check_calibration)) - {"self"} <= FLAT
    targets = [*links.INTS, *links.EVAL_INTS, *links.CHOICES]  # a link's parameters: the settings' own names
    assert set(targets) <= FLAT and set(links.FORMER.values()) <= set(targets)
    assert set(targets) <= {f.name for r in (wb.FitRequest, wb.EvalRequest) for f in fields(r)}


def test_validate_takes_each_flag_from_the_spec():
    assert validate._label("calib_seqs") == "calib_seqs (--calib-seqs)"
    assert all(validate._label(name) == f"{name} ({flag})" for name, flag in flat_flags().items())
    assert not set(validate.COMMAND_FLAGS) & FLAT  # the commands' own flags only, never a spec setting's
    assert validate._label("n_seqs") == "n_seqs"  # ghosted.calibrate's argument: no flag is claimed for it


@pytest.mark.parametrize("old", sorted(FORMER_NAMES))
def test_a_former_name_is_refused_with_the_name_to_use(old):
    with pytest.raises(TypeError, match=rf"{old} is now {FORMER_NAMES[old]}"):
        ExperimentSpec().with_options(**{old: 1})


SPELLINGS = {  # pattern of a former spelling -> files (under ghosted/ and pages/) allowed it, and why
    r"\bn_seqs\b": {
        "ghosted/__init__.py": "ghosted.calibrate reads its former keyword, with a DeprecationWarning",
        "ghosted/data/windows.py": "calibration_windows draws any windows (fit and held-out together)",
        "ghosted/experiments/spec.py": "FORMER_NAMES, which refuses it with the name to use",
    },
    r"\breplaceme_fold\b|\.mode\b|\bmode=": {
        "ghosted/experiments/spec.py": "FORMER_NAMES, which refuses them with the name to use",
        "pages/_charts.py": "Plotly's trace mode (markers, lines)",
    },
    r"\bheldout: int\b|\bheldout=int|CalibrationSpec\(": {  # a count of held-out windows; the nested names
        "ghosted/experiments/spec.py": "CalibrationSpec's nested fields, the recipe's JSON keys",
        "ghosted/data/windows.py": "split_calibration keeps the last `heldout` windows of any draw",
    },
}


@pytest.mark.parametrize("pattern", sorted(SPELLINGS))
def test_no_module_spells_a_setting_by_a_former_name(pattern):
    found = sorted({str(path.relative_to(ROOT)) for folder in ("ghosted", "pages")
                    for path in (ROOT / folder).rglob("*.py") if re.search(pattern, path.read_text())})
    assert set(found) <= set(SPELLINGS[pattern]), [f for f in found if f not in SPELLINGS[pattern]]
