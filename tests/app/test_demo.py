"""Demo mode (GHOSTED_DEMO=1): the app refuses what the deployment forbids, with a clear message."""

import pytest
from streamlit.testing.v1 import AppTest

from ghosted.service.deploy import DEMO, DeployRefusal, from_env, preset
from tests.app.conftest import ROOT, TIMEOUT, calibrate, errors, no_exception, open_page


@pytest.fixture
def demo(monkeypatch):
    monkeypatch.setenv("GHOSTED_DEMO", "1")
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT).run()


def test_environment_selects_the_demo_preset():
    assert from_env({"GHOSTED_DEMO": "1"}) is DEMO
    assert from_env({"GHOSTED_DEPLOY": "classroom"}).name == "classroom"
    assert from_env({}).name == "local" and not from_env({}).is_restricted
    with pytest.raises(ValueError, match="Unknown deployment"):
        preset("space")


def test_demo_limits():
    with pytest.raises(DeployRefusal, match="server's disk"):
        DEMO.check_model("/models/x", "folder")
    with pytest.raises(DeployRefusal, match="not offered"):
        DEMO.check_model("gpt2", "hub")
    with pytest.raises(DeployRefusal, match="trust_remote_code is off"):
        DEMO.check_model("bundled:smollm2-135m-instruct", "bundled", trust_remote_code=True)
    with pytest.raises(DeployRefusal, match="does not fetch"):
        DEMO.check_text_source("wikitext-2-raw-v1")
    with pytest.raises(DeployRefusal, match="at most 5 MB"):
        DEMO.check_upload(6 * 2**20)
    DEMO.check_model("bundled:smollm2-135m-instruct", "bundled")
    DEMO.check_calibration(16, 128, 4)
    preset("local").check_calibration(4096, 4096)


def test_demo_refuses_a_local_model_path(demo):
    open_page(demo, "model")
    assert "Local folder or .gguf file" not in demo.radio(key="model_kind").options
    demo.radio(key="model_kind").set_value("Hugging Face hub id")
    demo.text_input(key="model_where").set_value(str(ROOT))
    demo.button(key="model_load").click().run()
    no_exception(demo)
    assert any("does not load models from the server's disk" in e for e in errors(demo))
    assert demo.session_state["ghosted.model"]["source"] == "bundled:smollm2-135m-instruct"


def test_demo_refuses_an_over_cap_calibration(demo):
    calibrate(demo, [20, 21], ["ghost"], n=64, length=512, heldout=4)
    no_exception(demo)
    assert any("allows at most 8,192" in e for e in errors(demo))
    assert "ghosted.run" not in demo.session_state
    assert set(demo.radio(key="calib_kind").options) == {"Bundled news", "Bundled Wikipedia", "Upload a file"}


def test_demo_hides_the_model_download(demo):
    calibrate(demo, [20, 21], ["ghost"])
    assert "ghosted.run" in demo.session_state
    open_page(demo, "export")
    no_exception(demo)
    labels = [b.proto.label for b in demo.get("download_button")]
    assert "Recipe (JSON)" in labels and "Download the model (zip)" not in labels
    assert any("Model download is off" in i.value for i in demo.info)
