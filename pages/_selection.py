"""The layers to drop, as the pages share them: the one cross-page record, its checks and its words.

The Influence page sets the selection; the Recover page and the sidebar read it (through ``pages._ui``).
"""

from __future__ import annotations

import streamlit as st

from ghosted.service.frontend import format_layers, num_layers, removed_share

SELECTION = "ghosted.selection"  # list[int]: the layers to drop


def selection() -> list[int]:
    """The layers to drop, as chosen on the Influence page."""
    return list(st.session_state.get(SELECTION, []))


def set_selection(layers) -> None:
    """Store the layers to drop (the one cross-page record of the selection)."""
    st.session_state[SELECTION] = sorted({int(i) for i in layers})


def check_selection(model, layers: list[int]) -> None:
    """Refuse an empty selection or one that removes every layer."""
    if not layers:
        raise ValueError("Choose at least one layer to drop (Influence page) first.")
    if len(set(layers)) >= num_layers(model):
        raise ValueError(f"That drops all {num_layers(model)} layers: keep at least one.")


def selection_text(model, layers: list[int]) -> str:
    """E.g. "20-25 (6 of 30 layers, 17.9 % of parameters)"."""
    if not layers:
        return "no layers selected"
    share = removed_share(model, layers)
    return (f"{format_layers(layers)} ({len(layers)} of {num_layers(model)} layers, "
            f"{share:.1%} of parameters)")
