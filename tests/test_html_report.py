"""The HTML report: valid HTML5, self-contained, the range chart's rows, size at 300 modules.

The browser test (a real headless Chromium) is ``tests/test_html_browser.py``.
"""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

import html5lib
import pytest
from typer.testing import CliRunner

from nan_hunter.cli import app
from nan_hunter.core.range_map import Extent, ModuleRange, RangeMap
from nan_hunter.findings import Finding as FindingData
from nan_hunter.findings import Kind, Phase, Report, ScanTarget, Severity
from nan_hunter.report import render
from nan_hunter.report.range_map import group_modules
from tests.conftest import EXAMPLES, scanned

NS = "{http://www.w3.org/1999/xhtml}"
SVG = "{http://www.w3.org/2000/svg}"
BUNDLED = sorted(EXAMPLES.glob("*.py"))


def parse(document: str) -> ET.Element:
    """``document`` parsed the way a browser does; any parse error fails."""
    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=True)
    return parser.parse(document)


def chart_rows(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if "row" in g.get("class", "").split()]


def synthetic(modules: int, *, culprit: str = "") -> Report:
    """A report whose range map has ``modules`` rows named as a transformer's
    (``encoder.layers.N.attn.q`` ...), 12 per block; ``culprit`` gets an error."""
    names = [
        f"encoder.layers.{i // 12}.{part}"
        for i, part in zip(range(modules), [
            "attn.q", "attn.k", "attn.v", "attn.out", "attn.dropout", "norm1", "mlp.fc1",
            "mlp.act", "mlp.fc2", "mlp.dropout", "norm2", "residual",
        ] * (modules // 12 + 1), strict=False)
    ]
    rows = tuple(
        ModuleRange(name, Extent(1.5 * (i + 1), 4096, i, 0), Extent(40.0 * (i + 1), 4096), 2, i)
        for i, name in enumerate(names)
    )
    m = RangeMap("float16", 65504.0, 6.103515625e-05, 65536.0, rows)
    findings = ()
    if culprit:
        findings = (FindingData("NH102", Severity.ERROR, Kind.OVERFLOW, Phase.FORWARD,
                                "torch.matmul", culprit, None, True, "overflow"),)
    target = ScanTarget("model.py", "autocast", "float16", "cpu", "cuda")
    return Report(target, findings, modules * 2, modules, 0, 0.0, range_map=m)


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.stem)
def test_bundled_examples_render_valid_html5(path: Path) -> None:
    root = parse(render(scanned(path), "html"))
    ids = {e.get("id") for e in root.iter() if e.get("id")}
    assert {"range-map", "range-chart", "closest", "loss-scale", "findings", "not-checked"} <= ids


def test_matrix_inverse_chart_highlights_the_culprit_and_shades_fp16_range() -> None:
    root = parse(render(scanned(EXAMPLES / "matrix_inverse.py"), "html"))
    rows = chart_rows(root)
    assert [(r.get("data-module"), "culprit" in r.get("class", "")) for r in rows] == [
        ("(root)", True), ("head", False),
    ]
    bands = [r for r in root.iter(f"{SVG}rect") if r.get("data-band") == "fp16-normal"]
    assert len(bands) == 2  # forward and backward panels
    over = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "bar over"]
    assert over, "the inverse's 3.09e5 is drawn beyond the limit"


def test_report_is_self_contained() -> None:
    text = render(scanned(EXAMPLES / "matrix_inverse.py"), "html")
    root = parse(text)
    assert not list(root.iter(f"{NS}script"))
    assert not list(root.iter(f"{NS}link"))
    for element in root.iter():
        for name in ("src", "href"):
            assert element.get(name) is None, (element.tag, name)
    assert "http-equiv=\"Content-Security-Policy\" content=\"default-src 'none';" in text
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text


def test_repeated_blocks_are_one_row_each() -> None:
    report = synthetic(300)
    assert report.range_map is not None
    groups = group_modules(report.range_map.modules)
    assert [g.label for g in groups][:3] == [
        "encoder.layers.0-24.attn.q", "encoder.layers.0-24.attn.k", "encoder.layers.0-24.attn.v",
    ]
    assert len(groups) == 12
    q = groups[0]
    assert q.forward.abs_max == 1.5 * 289  # the largest of its 25 members (rows 0, 12 .. 288)


@pytest.mark.parametrize("modules", [80, 300])
def test_large_models_stay_small_and_readable(modules: int) -> None:
    text = render(synthetic(modules, culprit="encoder.layers.3.mlp.fc1"), "html")
    assert len(text.encode()) < 1_000_000
    root = parse(text)
    rows = chart_rows(root)
    assert len(rows) == 12
    culprits = [r.get("data-module") for r in rows if "culprit" in r.get("class", "")]
    assert culprits == [f"encoder.layers.0-{(modules - 1) // 12}.mlp.fc1"]
    table = next(e for e in root.iter(f"{NS}table") if e.get("id") == "modules")
    assert len(list(table.iter(f"{NS}tr"))) == modules + 1


def test_size_of_a_300_module_report() -> None:
    """The figure docs/output-formats.md gives: well under 1 MB."""
    size = len(render(synthetic(300), "html").encode())
    assert 20_000 < size < 300_000, size


def test_cli_writes_the_html_report(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    result = CliRunner().invoke(
        app, ["scan", str(EXAMPLES / "clean_mlp.py"), "--format", "html", "-o", str(target), "-q"]
    )
    assert result.exit_code == 0, result.stderr
    root = parse(target.read_text(encoding="utf-8"))
    assert [r.get("data-module") for r in chart_rows(root)] == [
        "fc1", "bn", "(root)", "fc2", "norm", "head",
    ]


def test_several_reports_in_one_document_keep_ids_unique() -> None:
    from nan_hunter.report.combined import render_many

    reports = [scanned(EXAMPLES / "clean_mlp.py"), scanned(EXAMPLES / "matrix_inverse.py")]
    root = parse(render_many(reports, [], "html"))
    ids = [e.get("id") for e in root.iter() if e.get("id")]
    assert len(ids) == len(set(ids))
    assert "r2-range-chart" in ids


def test_model_text_cannot_break_out_of_the_markup() -> None:
    hostile = "</svg></table><script>alert(1)</script><img src=x onerror=alert(1)>\x1b[2J"
    report = synthetic(12, culprit=f"encoder.layers.0.{hostile}")
    m = report.range_map
    assert m is not None
    rows = (*m.modules[:-1], dataclasses.replace(m.modules[-1], module=hostile))
    report = dataclasses.replace(
        report,
        range_map=dataclasses.replace(m, modules=rows),
        findings=tuple(dataclasses.replace(f, module=hostile, message=hostile, op=hostile)
                       for f in report.findings),
        target=dataclasses.replace(report.target, file=hostile, unchecked=(hostile,)),
    )
    text = render(report, "html")
    root = parse(text)
    assert not list(root.iter(f"{NS}script"))
    assert not list(root.iter(f"{NS}img"))
    assert "\x1b" not in text
    labels = [r.get("data-module") for r in chart_rows(root)]
    assert hostile.replace("\x1b", "\\x1b") in labels
