"""Ghosted in the browser: prune decoder layers, recover them without training, compare.

Run with ``streamlit run app.py``. This entrypoint is the frame around every page: it sets the
page config, the navigation (top bar) and the sidebar badge with the loaded model, device and the
current layer selection. Set ``GHOSTED_DEMO=1`` (or ``GHOSTED_DEPLOY=demo|classroom``) for a
public deployment with a model allow-list and size caps (see ``ghosted/service/deploy.py``).
"""

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import streamlit as st  # noqa: E402

from pages import _assets, _ui  # noqa: E402

st.set_page_config(page_title="Ghosted", page_icon=_assets.ICON, layout="wide")
_ui.init_state()
PAGES = [
    st.Page("pages/model.py", title="Model", icon=":material/memory:", default=True),
    st.Page("pages/influence.py", title="Influence", icon=":material/insights:"),
    st.Page("pages/recover.py", title="Calibrate & recover", icon=":material/healing:"),
    st.Page("pages/compare.py", title="Compare", icon=":material/compare_arrows:"),
    st.Page("pages/export.py", title="Export", icon=":material/download:"),
    st.Page("pages/learn.py", title="Learn", icon=":material/school:"),
]
page = st.navigation(PAGES, position="top")
_ui.open_deep_link()
_ui.open_link()  # a shared link's experiment (query parameters), once per session
_ui.warm_up()  # once per server: the precomputed presets' runs, refitted from the statistics cache
_ui.sidebar()
st.session_state[_ui.FRAMED] = True  # pages check it: they always run inside this frame
try:
    with _ui.page_run(page.title):  # the operator's page log, when one is set
        page.run()
finally:
    st.session_state[_ui.FRAMED] = False
