"""Model page: choose the model, dtype and device; show what was loaded."""

import streamlit as st

from ghosted.service.frontend import BUNDLED_MODEL, available_devices, describe, gpu_count
from pages import _ui

BUNDLED, PATH, HUB = "Bundled SmolLM2-135M-Instruct", "Local folder or .gguf file", "Hugging Face hub id"


def spec_form(cfg, spec: dict) -> dict | None:
    """The model form; returns the requested load arguments when submitted."""
    kinds = [BUNDLED, HUB] if not cfg.allow_local_paths else [BUNDLED, PATH, HUB]
    current = BUNDLED if spec["source"] == BUNDLED_MODEL else HUB
    with st.form("model_form"):
        kind = st.radio("Source", kinds, index=kinds.index(current), horizontal=True, key="model_kind")
        where = st.text_input("Folder, .gguf file or hub id", key="model_where",
                              value="" if spec["source"] == BUNDLED_MODEL else spec["source"],
                              placeholder="./my-model  ·  ~/models/x.gguf  ·  HuggingFaceTB/SmolLM2-360M",
                              help="Ignored for the bundled model.")
        if cfg.models is not None:
            st.caption(f"This deployment offers: {', '.join(cfg.models)}.")
        left, right = st.columns(2)
        dtype = left.selectbox("dtype", ["auto", "float32", "bfloat16", "float16"],
                               help="auto: bfloat16 on a GPU, float32 on a CPU")
        device = right.selectbox("Device", available_devices(), help="auto: cuda > mps > cpu")
        shard = gpu_count() > 1 and st.checkbox("Shard over every GPU (device_map='auto')")
        trust = cfg.allow_trust_remote_code and st.checkbox(
            "Trust remote code", help="Runs the Python code shipped with the model named above (its folder or "
                                      "hub repository) on this server, with its permissions. Only for code you trust.")
        if not st.form_submit_button("Load model", type="primary", key="model_load", disabled=_ui.busy()):
            return None
    source = BUNDLED_MODEL if kind == BUNDLED else where.strip()
    if not source:
        raise ValueError("Type a folder, a .gguf file or a hub id, or pick the bundled model.")
    return {"source": source, "dtype": dtype, "device": device,
            "device_map": "auto" if shard else None, "trust_remote_code": bool(trust)}


def show(loaded) -> None:
    """Facts about the loaded model."""
    facts = describe(loaded.model)
    st.subheader(loaded.name)
    cols = st.columns(6)
    cols[0].metric("Architecture", facts["family"])
    cols[1].metric("Layers", facts["layers"])
    cols[2].metric("Width d", facts["hidden_size"])
    cols[3].metric("Parameters", f"{facts['parameters'] / 1e6:,.1f} M")
    cols[4].metric("Memory", f"{facts['memory_mb']:,.0f} MB")
    cols[5].metric("Device", facts["device"])
    st.caption(f"{facts['architecture']} · {facts['dtype']} · source `{loaded.source}` "
               f"({loaded.kind}) · loaded in {loaded.load_seconds:.1f} s")
    if st.session_state[_ui.MODEL].get("trust_remote_code"):
        st.warning(f"Trust remote code is on: the Python code shipped with `{loaded.source}` runs on this server "
                   "whenever this model is loaded.")


_ui.require_frame(__file__)
st.title("Model")
st.write("Pick the model to prune. The bundled SmolLM2-135M-Instruct (30 layers, width 576) runs "
         "offline on a laptop CPU; any Hugging Face causal LM works on a workstation.")
with _ui.user_errors("The model was not loaded: "):
    requested = spec_form(_ui.deployment(), st.session_state[_ui.MODEL])
    if requested:
        _ui.check_spec(requested, _ui.deployment())
        _ui.load(requested)
        _ui.switch_model(requested)
        st.rerun()  # redraw the sidebar badge with the new model
show(_ui.require_model())
st.page_link("pages/influence.py", label="Next: find the layers to drop", icon=":material/arrow_forward:")
