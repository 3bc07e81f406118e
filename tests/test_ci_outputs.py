"""Text from the model cannot act on whoever reads a report: every output format is rendered from
a report whose every string field (file, module, op, source line, message, note, fix, diff,
suppression reason) holds hostile text, and checked for what that text could do there: a
workflow command of its own in a GitHub log, a block or raw HTML in a pull-request comment,
terminal control sequences, invalid XML."""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import types
import typing
import unicodedata
import xml.etree.ElementTree as ET
from collections import Counter
from html.parser import HTMLParser
from typing import Any

import pytest
from markdown_it import MarkdownIt

from nan_hunter.core.untrusted import ECHO_LIMIT, capped, echoed, shown, shown_lines
from nan_hunter.findings import Failed, Finding, Fix, Report, Severity
from nan_hunter.report import FORMATS, render
from nan_hunter.report.combined import render_many

HOSTILE = (
    "ok\n::error title=X::y.py\r\n\n"  # a workflow command of its own, after a blank line
    "\x1b]52;c;cHduZWQ=\x07"  # OSC 52: writes the reader's clipboard
    "\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\"  # OSC 8 hyperlink
    "\x1b[2J\x1b[1;1H\x1b]0;title\x07\x9b31m"  # clear, cursor move, window title, 8-bit CSI
    "\u202eevil\u202c\udce8\x01"  # bidi override, a lone surrogate, SOH (a path holds no NUL)
    "\n\n# heading\n\n<script>alert(1)</script><img src=x onerror=alert(1)>"
    "``` ```` ]]> | * _ [a](b) % , :"
)
BENIGN = "plain"


def _value(hint: Any, text: str) -> Any:
    """A value of the type ``hint`` whose strings are all ``text``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _value(next(a for a in typing.get_args(hint) if a is not type(None)), text)
    if origin is tuple:
        args = typing.get_args(hint)
        return (_value(args[0], text),) if args[-1] is Ellipsis else tuple(
            _value(a, text) for a in args
        )
    if hint is str:
        return text
    if hint is bool:
        return True
    if hint is int:
        return 3
    if hint is float:
        return 1.5
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return next(iter(hint))
    if dataclasses.is_dataclass(hint):
        return _instance(hint, text)
    raise TypeError(f"no value for {hint!r}")


def _instance(cls: Any, text: str) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name == "alternatives":  # a Fix in a Fix: one level is enough
            values[f.name] = ()
        else:
            values[f.name] = _value(hints[f.name], text)
    return cls(**values)


def report_of(text: str) -> Report:
    """A report whose every string is ``text``: an error, a warning and a suppressed finding."""
    finding: Finding = _instance(Finding, text)
    finding = dataclasses.replace(
        finding, code="NH101", severity=Severity.ERROR, suppression=None,
        fix=dataclasses.replace(finding.fix, alternatives=(_instance(Fix, text),)),
    )
    warning = dataclasses.replace(finding, code="NH402", severity=Severity.WARNING)
    suppressed = dataclasses.replace(finding, suppression=_instance(Finding, text).suppression)
    base: Report = _instance(Report, text)
    return dataclasses.replace(base, findings=(finding, warning, suppressed), warnings_total=1)


def _outputs(text: str) -> dict[str, str]:
    report = report_of(text)
    failed = [Failed(text, text)]
    single = {fmt: render(report, fmt) for fmt in FORMATS}
    single["text-color"] = render(report, "text", color=True)
    single["text-wrapped"] = render(report, "text", color=True, width=80)
    many = {f"{fmt}-many": render_many([report], failed, fmt) for fmt in FORMATS}
    return single | many


_SGR = re.compile(r"\x1b\[[0-9;]*m")
"""rich's own styling, the only escape sequence a colour report may hold."""


def _unsafe(text: str) -> list[str]:
    return [
        c for c in _SGR.sub("", text)
        if c not in "\n\t" and (unicodedata.category(c) in ("Cc", "Cs") or "\u202a" <= c <= "\u202e"
                                or "\u2066" <= c <= "\u2069")
    ]


@pytest.mark.parametrize(
    "fmt", [*FORMATS, "text-color", "text-wrapped", *(f"{fmt}-many" for fmt in FORMATS)]
)
def test_no_control_character_from_the_model_reaches_any_output(fmt: str) -> None:
    out = _outputs(HOSTILE)[fmt]
    assert _unsafe(out) == []
    out.encode("utf-8")  # writable: no lone surrogate left


@pytest.mark.parametrize("fmt", ["github", "github-many"])
def test_github_output_has_only_our_own_commands(fmt: str) -> None:
    """Every line is an annotation of ours or our summary; the model's newline forges none."""
    hostile, benign = _outputs(HOSTILE)[fmt], _outputs(BENIGN)[fmt]
    lines = hostile.splitlines()
    assert len(lines) == len(benign.splitlines())
    for line in lines:
        assert re.match(r"(::(error|warning|notice) [^:]*::|nan-hunter: \d+ error)", line), line
    for line in lines:
        if line.startswith("::"):
            properties = line.split(" ", 1)[1].split("::", 1)[0]
            # a model's ':' or ',' cannot end a property early: every key is one of ours
            assert {p.split("=", 1)[0] for p in properties.split(",")} <= {"file", "line", "title"}
    assert "%25" in hostile and "%3A" in hostile and "%2C" in hostile


def test_github_summary_of_a_file_name_with_a_newline() -> None:
    report = dataclasses.replace(
        report_of(BENIGN), findings=(), warnings_total=0,
        target=dataclasses.replace(report_of(BENIGN).target, file="ok\n::error title=X::y.py"),
    )
    out = render(report, "github")
    assert out == "nan-hunter: 0 errors, 0 warnings in ok%0A::error title=X::y.py\n"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: Counter[str] = Counter()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1


def _html_tags(markdown: str) -> Counter[str]:
    html = MarkdownIt("commonmark").enable("table").render(markdown)
    parser = _Tags()
    parser.feed(html)
    return parser.tags


@pytest.mark.parametrize("fmt", ["markdown", "markdown-many"])
def test_markdown_from_the_model_adds_no_block_no_html_and_no_link(fmt: str) -> None:
    """The rendered pull-request comment has the same elements whatever the model's names and
    messages hold: no heading, paragraph, fence, link, script or image of the model's making."""
    hostile, benign = _outputs(HOSTILE)[fmt], _outputs(BENIGN)[fmt]
    assert _html_tags(hostile) == _html_tags(benign)
    assert "<script" not in MarkdownIt("commonmark").render(hostile)


def test_markdown_fence_outlasts_an_indented_backtick_run_in_the_diff() -> None:
    """A diff's context line of a docstring holding ```` ``` ```` starts with a space: it would
    close a fence of three backticks."""
    report = report_of(BENIGN)
    error = dataclasses.replace(
        report.findings[0],
        fix=dataclasses.replace(
            report.findings[0].fix, alternatives=(),
            diff="--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n ```\n-x\n+y\n",
        ),
    )
    out = render(dataclasses.replace(report, findings=(error,)), "markdown")
    html = MarkdownIt("commonmark").render(out)
    diff = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n ```\n-x\n+y\n"
    assert f'<pre><code class="language-diff">{diff}</code></pre>' in html


@pytest.mark.parametrize("fmt", ["junit", "junit-many"])
def test_junit_is_valid_xml_with_every_field_hostile(fmt: str) -> None:
    out = _outputs(HOSTILE)[fmt]
    suite = ET.fromstring(out.encode())
    assert suite.tag == "testsuite"
    text = " ".join([*(e.text or "" for e in suite.iter()),
                     *(v for e in suite.iter() for v in e.attrib.values())])
    assert "]]>" in text  # kept, escaped by the serializer
    assert "\\x1b]52" in text  # the escape sequence shown, not sent


@pytest.mark.parametrize("fmt", ["json", "json-many", "sarif", "sarif-many"])
def test_json_formats_keep_the_model_text_exactly(fmt: str) -> None:
    """JSON escapes every control character itself; a machine reader gets the true names (a lone
    surrogate, which JSON cannot carry as UTF-8, is escaped by the encoder as ``\\udce8``)."""
    out = _outputs(HOSTILE)[fmt]
    assert "\x1b" not in out  # JSON writes it as \u001b

    def strings(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    assert HOSTILE in strings(json.loads(out))


def test_text_report_lines_are_ours() -> None:
    """The model's newlines forge no line (a fake ``clean:`` summary, a heading of ours)."""
    for fmt in ("text", "text-color"):
        hostile, benign = _outputs(HOSTILE)[fmt], _outputs(BENIGN)[fmt]
        # the fix's and its alternative's diff keep theirs, under the error and the warning
        diff_lines = HOSTILE.count("\n") * 4
        assert len(hostile.splitlines()) == len(benign.splitlines()) + diff_lines


def test_shown_escapes_controls_and_keeps_text() -> None:
    assert shown("a\x1b]0;t\x07\tb\r\nc\u202e\udce8\x9b") == (
        "a\\x1b]0;t\\x07\tb\\r\\nc\\u202e\\udce8\\x9b"
    )
    assert shown("plain text: ünïcode, 日本, emoji 🙂") == "plain text: ünïcode, 日本, emoji 🙂"
    assert shown_lines("a\nb\x1b[2J") == "a\nb\\x1b[2J"


def test_capped_says_how_much_was_left_out() -> None:
    assert capped("x" * ECHO_LIMIT) == "x" * ECHO_LIMIT
    assert capped("x" * (ECHO_LIMIT + 5)) == "x" * ECHO_LIMIT + "... (5 more)"
    assert echoed("\x1b" * 3, limit=2) == "\\x1b\\x1b... (1 more)"
