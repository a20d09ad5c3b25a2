"""report.html as a reader sees it: opened in headless Chromium (Debian's /usr/bin/chromium), every
image loads, nothing is wider than the window or its container, and no text is under 9 px.

No new Python dependency: a checking script is injected into a copy of the page (beside the
original, so the figures' relative paths resolve); it runs on the page's load event and writes its
findings into the DOM as JSON, which ``chromium --headless --dump-dom`` prints.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)
from _evaluated_fixture import evaluated  # noqa: F401  (session fixture: a real evaluation with every baseline)

CHROMIUM = Path("/usr/bin/chromium")
#: desktop windows the report must fit without horizontal scrolling (CSS px).
WIDTHS = (1280, 1024)
#: smallest text size a reader can read at 100% (CSS px).
MIN_TEXT_PX = 9.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.is_file(), reason="needs Debian's chromium at /usr/bin/chromium "
                                                      "(apt-get install -y chromium); CI has none"),
]

CHECK_SCRIPT = """
<script>
window.addEventListener("load", () => {
  const out = {images: [], overflow: [], small_text: [], scroll_width: document.documentElement.scrollWidth,
               inner_width: window.innerWidth};
  for (const img of document.images) {
    out.images.push({src: img.currentSrc || img.getAttribute("srcset"), complete: img.complete,
                     natural_width: img.naturalWidth, width: img.getBoundingClientRect().width});
  }
  for (const el of document.body.querySelectorAll("*")) {
    const parent = el.parentElement, box = el.getBoundingClientRect(), outer = parent.getBoundingClientRect();
    if (el.id === "namsa-check" || (box.width === 0 && box.height === 0)) continue;   // not laid out (script)
    if (box.right > outer.right + 1 || box.left < outer.left - 1) {
      out.overflow.push({tag: el.tagName, text: (el.textContent || "").slice(0, 60), right: box.right,
                         container_right: outer.right});
    }
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    const size = parseFloat(getComputedStyle(el).fontSize);
    if (own && size < MIN_PX) out.small_text.push({tag: el.tagName, size: size, text: el.textContent.slice(0, 60)});
  }
  const pre = document.createElement("pre");
  pre.id = "namsa-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def _check_page(report: Path, width: int, tmp_path: Path) -> dict:
    """Open a copy of ``report`` with the checking script at ``width`` CSS px; its findings."""
    page = report.with_name("report.check.html")
    html = report.read_text(encoding="utf-8")
    page.write_text(html.replace("</body>", CHECK_SCRIPT.replace("MIN_PX", str(MIN_TEXT_PX)) + "</body>"),
                    encoding="utf-8")
    profile = tmp_path / f"chromium-profile-{width}"
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--hide-scrollbars", f"--window-size={width},900",
           "--allow-file-access-from-files", "--virtual-time-budget=10000", "--dump-dom", page.as_uri()]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    finally:
        page.unlink(missing_ok=True)
        shutil.rmtree(profile, ignore_errors=True)
    found = re.search(r'<pre id="namsa-check">(.*?)</pre>', done.stdout, re.S)
    assert found, f"the checking script did not run (chromium exit {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">"))


@pytest.fixture(scope="module")
def report_html(evaluated):  # noqa: F811
    """report.html of a real evaluation of the tiny trained model on the tiny data, every baseline on
    (the `evaluated` fixture of tests/_evaluated_fixture.py)."""
    return evaluated[0].report_html


@pytest.mark.parametrize("width", WIDTHS)
def test_report_in_chromium_loads_every_image_fits_and_reads(report_html, width, tmp_path):
    found = _check_page(report_html, width, tmp_path)
    assert found["images"], "the report shows no figure"
    for img in found["images"]:
        assert img["complete"] and img["natural_width"] > 0, f"image did not load: {img}"
    assert found["scroll_width"] <= found["inner_width"], \
        f"the page scrolls sideways at {width} px: {found['scroll_width']} px wide"
    assert not found["overflow"], f"elements wider than their container at {width} px: {found['overflow'][:5]}"
    assert not found["small_text"], f"text under {MIN_TEXT_PX} px: {found['small_text'][:5]}"


def test_figures_show_at_the_size_their_fonts_were_set_for(report_html, tmp_path):
    """At a desktop width no figure is scaled down: each shows at its declared (2x) size, PNG width / 2
    CSS px, so a 9 pt label is 12 px on screen (naturalWidth of a 2x image is already halved)."""
    found = _check_page(report_html, WIDTHS[0], tmp_path)
    for img in found["images"]:
        assert img["width"] == pytest.approx(img["natural_width"], abs=1.5), img
