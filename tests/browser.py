"""A headless Chromium for the HTML report's tests, and the README's screenshot.

    python -m tests.browser          # rewrite docs/images/matrix_inverse_report.png

Chromium is Debian's ``chromium`` package (``apt-get install chromium``; ``.ci/run`` installs
it); the browser tests skip without it. Chromium's own background traffic (updates, accounts)
is told apart from the page's requests by the network isolation key, which for a page loaded
from a file is ``file://``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from nan_hunter.report import render

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio",
)
README_SHOT = Path(__file__).resolve().parents[1] / "docs" / "images" / "matrix_inverse_report.png"


def find_browser() -> str | None:
    return next((path for name in NAMES if (path := shutil.which(name))), None)


def _run(browser: str, page: Path, *extra: str, timeout: float = 60) -> str:
    done = subprocess.run(
        [browser, *FLAGS, *extra, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{browser} exited {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout


def rendered_dom(browser: str, page: Path) -> str:
    """The document as the browser built it (``--dump-dom``, after layout)."""
    return _run(browser, page, "--dump-dom")


def screenshot(browser: str, page: Path, png: Path, size: tuple[int, int] = (1200, 1600)) -> None:
    _run(browser, page, f"--window-size={size[0]},{size[1]}", f"--screenshot={png}")


def page_requests(browser: str, page: Path, net_log: Path) -> list[str]:
    """Every URL the page itself asked for while it loaded (file:// and data: ones included)."""
    _run(browser, page, f"--log-net-log={net_log}", "--dump-dom")
    events = json.loads(net_log.read_text(encoding="utf-8"))["events"]
    urls = []
    for event in events:
        params = event.get("params") or {}
        key = str(params.get("network_isolation_key", ""))
        if "url" in params and key.startswith("file://"):
            urls.append(str(params["url"]))
    return urls


def png_size(png: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    data = png.read_bytes()[:24]
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{png} is not a PNG")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def main() -> None:
    """Scan the matrix-inverse example and write the README's screenshot of its report."""
    import dataclasses
    import tempfile

    from nan_hunter.api import scan_file

    browser = find_browser()
    if browser is None:
        sys.exit("no chromium found")
    root = README_SHOT.parents[2]
    report = dataclasses.replace(scan_file(str(root / "examples" / "matrix_inverse.py")),
                                 seconds=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(render(report, "html"), encoding="utf-8")
        README_SHOT.parent.mkdir(parents=True, exist_ok=True)
        screenshot(browser, page, README_SHOT, size=(1100, 860))
    print(f"wrote {README_SHOT}")


if __name__ == "__main__":
    main()
