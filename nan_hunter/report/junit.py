"""JUnit XML for CI test tabs: one suite with one test case, the scanned file.

The case fails when there are error findings; the failure lists every finding, one per line.
Warnings alone pass, listed in ``system-out``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence

from nan_hunter.core.untrusted import shown_lines
from nan_hunter.findings import Failed, Finding, Report
from nan_hunter.report.paths import display_path

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""Characters XML 1.0 cannot hold at all, not even escaped."""


def render_junit(report: Report) -> str:
    return render_junit_many([report])


def render_junit_many(reports: Sequence[Report], failed: Sequence[Failed] = ()) -> str:
    """One suite: a test case per scanned file, and one with an ``error`` per file that could
    not be scanned."""
    cases = [_case(report) for report in reports]
    failures = sum(1 for _, failing in cases if failing)
    seconds = sum(report.seconds for report in reports)
    suite = ET.Element(
        "testsuite",
        {
            "name": "nan-hunter",
            "tests": str(len(reports) + len(failed)),
            "failures": str(failures),
            "errors": str(len(failed)),
            "time": f"{seconds:.3f}",
        },
    )
    suite.extend(case for case, _ in cases)
    for failure in failed:
        attributes = {"classname": "nan-hunter", "name": _xml(failure.path), "time": "0.000"}
        case = ET.SubElement(suite, "testcase", attributes)
        ET.SubElement(case, "error", {"message": _xml(failure.message), "type": "error"})
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


def _case(report: Report) -> tuple[ET.Element, bool]:
    errors = [f for f in report.active if f.is_error]
    target = display_path(report.target.file)
    case = ET.Element(
        "testcase",
        {"classname": "nan-hunter", "name": _xml(target), "time": f"{report.seconds:.3f}"},
    )
    listing = "\n".join(_line(f, target) for f in report.active)
    if errors:
        first = errors[0]
        noun = "error" if len(errors) == 1 else "errors"
        failure = ET.SubElement(
            case,
            "failure",
            {"message": _xml(f"{len(errors)} {noun}: {first.message}"), "type": first.code},
        )
        failure.text = _xml(listing)
    elif report.active:
        ET.SubElement(case, "system-out").text = _xml(listing)
    elif report.status == "not_checked":  # nan-hunter run saw no step: not a pass
        why = report.target.notes[0] if report.target.notes else "nothing was checked"
        ET.SubElement(case, "skipped", {"message": _xml(why)})
    return case, bool(errors)


def _line(f: Finding, target: str) -> str:
    """``file:line: CODE severity message``; a finding without a location names the target."""
    where = f"{display_path(f.location.file)}:{f.location.line}" if f.location else target
    return f"{where}: {f.code} {f.severity.value} {f.message}"


def _xml(text: str) -> str:
    """Control characters shown escaped (a test tab is a terminal too), then whatever XML 1.0
    cannot hold replaced (ElementTree escapes ``<``, ``&`` and ``>``, so ``]]>`` is harmless)."""
    return _NOT_XML.sub("\ufffd", shown_lines(text))
