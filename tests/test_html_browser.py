"""The HTML report in a real browser (headless Chromium): it renders, the culprit's row and the
FP16 band are in the DOM the browser built, and loading it makes no request.

Skipped when no Chromium is installed; ``.ci/run`` installs Debian's ``chromium``.
"""

from __future__ import annotations

from pathlib import Path

import html5lib
import pytest

from nan_hunter.report import render
from tests.browser import find_browser, page_requests, png_size, rendered_dom, screenshot
from tests.conftest import EXAMPLES, scanned

BROWSER = find_browser()
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium installed")
SVG = "{http://www.w3.org/2000/svg}"
BUNDLED = sorted(EXAMPLES.glob("*.py"))


def _page(tmp_path: Path, path: Path) -> Path:
    page = tmp_path / f"{path.stem}.html"
    page.write_text(render(scanned(path), "html"), encoding="utf-8")
    return page


def _rows(dom: str) -> list[tuple[str | None, bool]]:
    root = html5lib.parse(dom)
    return [
        (g.get("data-module"), "culprit" in g.get("class", "").split())
        for g in root.iter(f"{SVG}g")
        if "row" in g.get("class", "").split()
    ]


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.stem)
def test_browser_renders_the_bundled_reports(path: Path, tmp_path: Path) -> None:
    assert BROWSER is not None
    page = _page(tmp_path, path)
    png = tmp_path / f"{path.stem}.png"
    screenshot(BROWSER, page, png, size=(1200, 1400))
    assert png_size(png) == (1200, 1400)
    assert png.stat().st_size > 20_000  # a drawn page, not a blank one
    dom = rendered_dom(BROWSER, page)
    assert 'data-band="fp16-normal"' in dom
    assert _rows(dom), "the range chart has rows"


def test_browser_dom_has_the_matrix_inverse_culprit_row(tmp_path: Path) -> None:
    assert BROWSER is not None
    dom = rendered_dom(BROWSER, _page(tmp_path, EXAMPLES / "matrix_inverse.py"))
    assert _rows(dom) == [("(root)", True), ("head", False)]
    assert dom.count('data-band="fp16-normal"') == 2


def test_loading_a_report_requests_nothing_outside_it(tmp_path: Path) -> None:
    assert BROWSER is not None
    page = _page(tmp_path, EXAMPLES / "matrix_inverse.py")
    urls = page_requests(BROWSER, page, tmp_path / "net.json")
    assert [u for u in urls if not u.startswith(("file:", "data:"))] == []


def test_the_request_check_sees_an_external_image(tmp_path: Path) -> None:
    """The control: the same check on a page with an external image reports it."""
    assert BROWSER is not None
    page = tmp_path / "external.html"
    page.write_text('<!DOCTYPE html><img src="http://example.invalid/x.png">', encoding="utf-8")
    urls = page_requests(BROWSER, page, tmp_path / "net.json")
    assert "http://example.invalid/x.png" in urls
