"""JUnit XML for CI test tabs: one suite with one test case, the scanned file.

The case fails when there are error findings; the failure lists every finding, one per line.
Warnings alone pass, listed in ``system-out``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from nan_hunter.findings import Finding, Report
from nan_hunter.report.paths import display_path

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""Characters XML 1.0 cannot hold at all, not even escaped."""


def render_junit(report: Report) -> str:
    errors = [f for f in report.findings if f.is_error]
    target = display_path(report.target.file)
    suite = ET.Element(
        "testsuite",
        {
            "name": "nan-hunter",
            "tests": "1",
            "failures": "1" if errors else "0",
            "errors": "0",
            "time": f"{report.seconds:.3f}",
        },
    )
    case = ET.SubElement(
        suite,
        "testcase",
        {"classname": "nan-hunter", "name": _xml(target), "time": f"{report.seconds:.3f}"},
    )
    listing = "\n".join(_line(f, target) for f in report.findings)
    if errors:
        first = errors[0]
        noun = "error" if len(errors) == 1 else "errors"
        failure = ET.SubElement(
            case,
            "failure",
            {"message": _xml(f"{len(errors)} {noun}: {first.message}"), "type": first.code},
        )
        failure.text = _xml(listing)
    elif report.findings:
        ET.SubElement(case, "system-out").text = _xml(listing)
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _line(f: Finding, target: str) -> str:
    """``file:line: CODE severity message``; a finding without a location names the target."""
    where = f"{display_path(f.location.file)}:{f.location.line}" if f.location else target
    return f"{where}: {f.code} {f.severity.value} {f.message}"


def _xml(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)
