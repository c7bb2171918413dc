"""The app works offline: no icon or image it shows is fetched from the network (AST scan; fast)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py")), *sorted((ROOT / "ui").glob("*.py"))]
ASSET_ARGS = {"icon", "page_icon", "image", "logo", "src", "icon_image"}  # keywords that name a picture
ASSET_CALLS = {"image", "logo", "set_page_config", "html"}                  # st.image(url), st.logo(url), ...
URL = re.compile(r"https?://(?!127\.0\.0\.1|localhost)", re.I)
EMBEDDED = re.compile(r"!\[[^\]]*\]\(\s*https?://|<img[^>]+src=['\"]?https?://|url\(\s*['\"]?https?://", re.I)


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def network_assets(source: str) -> list[str]:
    """The http(s) pictures a module would load at run time, and a page icon the browser fetches from a font CDN."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            values = [kw.value for kw in node.keywords if kw.arg in ASSET_ARGS]
            values += node.args if name in ASSET_CALLS else []
            found += [s for v in values for s in _strings(v) if URL.match(s.strip())]
            page_icon = [kw.value for kw in node.keywords if kw.arg == "page_icon"]
            # Streamlit 1.67 turns a ":material/...:" favicon into a fonts.gstatic.com URL; an emoji is drawn inline
            found += [s for v in page_icon for s in _strings(v) if s.startswith(":material/")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and EMBEDDED.search(node.value):
            found.append(node.value)
    return found


def test_no_icon_or_image_of_the_app_comes_from_the_network():
    assert SOURCES[0].is_file() and len(SOURCES) > 20
    found = {str(p.relative_to(ROOT)): hits for p in SOURCES if (hits := network_assets(p.read_text()))}
    assert not found, found


def test_the_scan_sees_a_network_icon_an_image_and_a_font_cdn_favicon():
    assert network_assets('st.set_page_config(page_icon=":material/bolt:")')
    assert network_assets('st.image("https://example.com/a.png")')
    assert network_assets('st.Page("p.py", icon="https://example.com/i.svg")')
    assert network_assets('st.markdown("![logo](https://example.com/a.png)")')
    assert not network_assets('st.set_page_config(page_icon="⚡")')
    assert not network_assets('st.markdown("see https://docs.vllm.ai for more")')  # a link, not an asset
