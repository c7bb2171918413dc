"""Speculators Workbench: the frame of the Streamlit app (page config, shared state, navigation, sidebar).

Run with `streamlit run app.py` (or `make app`). Every page lives in pages/ and mirrors a CLI command.
"""

from __future__ import annotations

import streamlit as st

from ui import sidebar, state
from ui.errors import guard, show_pending
from ui.resources import log_to_terminal
from ui.start import url_path

PAGES = {
    "Start": [
        ("pages/start.py", "Start", ":material/home:"),
    ],
    "Models": [
        ("pages/models.py", "Models", ":material/hub:"),
    ],
    "Data & training": [
        ("pages/data.py", "Data", ":material/dataset:"),
        ("pages/train.py", "Train", ":material/model_training:"),
    ],
    "Drafts": [
        ("pages/convert.py", "Convert", ":material/transform:"),
        ("pages/config_builder.py", "Config builder", ":material/tune:"),
    ],
    "Compare": [
        ("pages/demo_chat.py", "Demo chat", ":material/chat:"),
        ("pages/benchmarks.py", "Benchmarks", ":material/speed:"),
        ("pages/serve.py", "Serve", ":material/dns:"),
    ],
    "Jobs": [
        ("pages/jobs.py", "Jobs", ":material/work_history:"),
    ],
}


START = "pages/start.py"


def run() -> None:
    log_to_terminal()
    # an emoji favicon is drawn in the browser; a ":material/...:" one is fetched from a font CDN (fails offline)
    st.set_page_config(page_title="Speculators Workbench", page_icon="⚡", layout="wide")
    state.init_state()
    # the start page is "/"; every other page has the URL of its file name (/models, /demo_chat, ...), typed or linked
    nav = st.navigation({section: [st.Page(path, title=title, icon=icon, default=(path == START),
                                           url_path=None if path == START else url_path(path))
                                   for path, title, icon in pages] for section, pages in PAGES.items()})
    sidebar.render()
    show_pending()
    try:
        with guard(nav.title):  # the last net: an unexpected error is a message, not a traceback
            nav.run()
    finally:  # also when a page reruns the script: the choices made so far survive a reload
        state.save_state()


run()
