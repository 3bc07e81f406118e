"""A model whose module names are markup (``<script>``, ``</svg>``, ``<img onerror>``): the HTML
report shows them as text, in the chart, the tables and the findings, and runs nothing."""

from __future__ import annotations

from pathlib import Path

import html5lib
from typer.testing import CliRunner

from nan_hunter.cli import app

MODEL = '''
import torch
from torch import nn

NAMES = ["</svg><script>alert(1)</script>", "</table><img src=x onerror=alert(2)>"]


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module(NAMES[0], nn.Linear(8, 8))
        self.add_module(NAMES[1], nn.Linear(8, 4))
        with torch.no_grad():
            getattr(self, NAMES[1]).weight.mul_(1e5)

    def forward(self, x):
        return getattr(self, NAMES[1])(getattr(self, NAMES[0])(x) * 100.0)


def build_model():
    torch.manual_seed(0)
    return Model()


def sample_batch():
    torch.manual_seed(0)
    return torch.randn(4, 8)
'''

SVG = "{http://www.w3.org/2000/svg}"
HTML = "{http://www.w3.org/1999/xhtml}"


def test_module_names_are_text_in_the_html_report(work: Path) -> None:
    (work / "model.py").write_text(MODEL)
    result = CliRunner().invoke(
        app, ["scan", "model.py", "-q", "--format", "html", "-o", "report.html", "--no-verify"]
    )
    assert result.exit_code == 1, result.stderr  # the second Linear overflows
    text = (work / "report.html").read_text(encoding="utf-8")
    root = html5lib.HTMLParser(strict=True, namespaceHTMLElements=True).parse(text)
    assert not list(root.iter(f"{HTML}script")) and not list(root.iter(f"{SVG}script"))
    assert not list(root.iter(f"{HTML}img"))
    assert not any(e.get("onerror") for e in root.iter())
    rows = [g for g in root.iter(f"{SVG}g") if "row" in g.get("class", "").split()]
    labels = [g.get("data-module") for g in rows]
    assert labels == [
        "</svg><script>alert(1)</script>", "(root)", "</table><img src=x onerror=alert(2)>",
    ]
    culprit = [g.get("data-module") for g in rows if "culprit" in g.get("class", "")]
    assert culprit == ["</table><img src=x onerror=alert(2)>"]
    chart = next(e for e in root.iter(f"{SVG}svg") if e.get("id") == "range-chart")
    assert len([g for g in chart.iter(f"{SVG}g") if "row" in g.get("class", "")]) == 3
