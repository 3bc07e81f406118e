"""The JSON report: ``schema: "nan-hunter/report/v1"``, stable field names, findings in order."""

from __future__ import annotations

import json
import math
from typing import Any

from nan_hunter.core.range_map import Extent, OpRange, RangeMap
from nan_hunter.findings import (
    Finding,
    Fix,
    FixCost,
    OpRef,
    Report,
    SourceLocation,
    TrainingSteps,
)
from nan_hunter.report.paths import display_path
from nan_hunter.version import __version__

SCHEMA = "nan-hunter/report/v1"


def _location(loc: SourceLocation | None) -> dict[str, Any] | None:
    if loc is None:
        return None
    return {"file": display_path(loc.file), "line": loc.line, "code": loc.code}


def _upstream(ref: OpRef | None) -> dict[str, Any] | None:
    if ref is None:
        return None
    return {
        "op": ref.op,
        "module": ref.module,
        "location": _location(ref.location),
        "reason": ref.reason,
    }


def _fix(fix: Fix) -> dict[str, Any]:
    return {
        "title": fix.title,
        "applicability": fix.applicability.value,
        "diff": fix.diff,
        "file": display_path(fix.file) if fix.file else None,
        "verified": fix.verified,
        "remaining": list(fix.remaining),
        "fp32_loss_change": fix.fp32_loss_change,
        "edits": [
            {"file": display_path(e.file), "start": e.start, "end": e.end,
             "replacement": e.replacement}
            for e in fix.edits
        ],
        "alternatives": [_fix(alt) for alt in fix.alternatives],
        "cost": _cost(fix.cost),
    }


def _cost(cost: FixCost | None) -> dict[str, Any] | None:
    if cost is None:
        return None
    return {
        "fp32_matmul_share": cost.fp32_matmul_share,
        "fp32_elementwise_share": cost.fp32_elementwise_share,
        "baseline_matmul_share": cost.baseline_matmul_share,
        "baseline_elementwise_share": cost.baseline_elementwise_share,
        "added_matmul_share": cost.added_matmul_share,
        "added_elementwise_share": cost.added_elementwise_share,
        "shared": cost.shared,
        "low_precision": cost.low_precision,
    }


def finding_dict(f: Finding) -> dict[str, Any]:
    data = _finding_fields(f)
    if f.suppression is not None:  # only then, so reports without suppressions keep their shape
        data["suppressed"] = True
        data["suppression"] = {
            "reason": f.suppression.reason,
            "file": display_path(f.suppression.file),
            "line": f.suppression.line,
        }
    return data


def _finding_fields(f: Finding) -> dict[str, Any]:
    return {
        "code": f.code,
        "severity": f.severity.value,
        "kind": f.kind.value,
        "phase": f.phase.value,
        "op": f.op,
        "module": f.module,
        "modules": list(f.modules or ((f.module,) if f.module else ())),
        "location": _location(f.location),
        "origin": f.origin,
        "fp32_rerun": None
        if f.fp32_rerun is None
        else {
            "finite": f.fp32_rerun.finite,
            "abs_max": f.fp32_rerun.abs_max,
            "own_inputs_finite": f.fp32_rerun.own_inputs_finite,
        },
        "message": f.message,
        "fix": None if f.fix is None else _fix(f.fix),
        "call_site": _location(f.call_site),
        "upstream": _upstream(f.upstream),
        "notes": list(f.notes),
        "inputs": [s.to_dict() for s in f.inputs],
        "outputs": [s.to_dict() for s in f.outputs],
    }


def report_dict(report: Report) -> dict[str, Any]:
    t = report.target
    return {
        "schema": SCHEMA,
        "tool": {"name": "nan-hunter", "version": __version__},
        "target": {
            "file": display_path(t.file),
            "mode": t.mode,
            "dtype": t.dtype,
            "device": t.device,
            "policy": t.policy,
            "notes": [*t.notes, *t.unchecked],
            "loss_scaling": None
            if t.loss_scaling is None
            else {
                "policy": t.loss_scaling.policy,
                "initial": t.loss_scaling.initial,
                "used": t.loss_scaling.used,
                "skipped_steps": t.loss_scaling.skipped,
            },
        },
        "status": report.status,
        "findings": [finding_dict(f) for f in report.findings],
        "loss_scale": _loss_scale(report),
        "headroom": _headroom(report.range_map),
        "closest": _closest(report.range_map),
        "summary": {
            "ops": report.ops,
            "backward_nodes": report.backward_nodes,
            "errors": report.errors,
            "warnings": report.warnings,
            "propagated": report.propagated,
            "seconds": round(report.seconds, 4),
            "not_checked": list(t.unchecked),
        }
        | ({"suppressed": len(report.suppressed)} if report.suppressed else {}),
    } | _training(report) | _precision(report)


def _precision(report: Report) -> dict[str, Any]:
    """The precision check's verdict; nothing when it did not run (the shape unchanged)."""
    p = report.precision_check
    if p is None:
        return {}
    return {"precision": {
        "loss_relative_error": _finite_or_none(p.loss_error),
        "grad_cosine": p.grad_cosine,
        "ops_compared": p.compared,
        "largest_op_error": _finite_or_none(p.largest_error),
        "largest_op_error_at": p.largest_at,
        "complete": p.complete,
    }}


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) or math.isnan(value) else value


def _training(report: Report) -> dict[str, Any]:
    """``nan-hunter run``'s ``training`` object; nothing for ``scan`` (its shape unchanged)."""
    run = report.training
    if run is None:
        return {}
    return {"training": training_object(run)}


def training_object(run: TrainingSteps) -> dict[str, Any]:
    """The ``training`` object of JSON and SARIF: the steps checked, the problem step, the
    verdict on its cause with its evidence (null and empty when no step was re-run), and the
    reproduction bundle when one was made."""
    training: dict[str, Any] = {
        "steps_checked": run.steps_checked, "problem_step": run.problem_step,
        "losses_checked": run.losses_checked,
        "verdict": run.verdict.value if run.verdict is not None else None,
        "evidence": list(run.evidence),
    }
    if run.repro is not None:
        repro = run.repro
        training["repro"] = {"path": repro.path, "bytes": repro.size_bytes,
                             "written": repro.written, "note": repro.note}
    if run.samples:
        training["samples"] = run.samples
        training["forecast"] = [
            {
                "module": t.module, "steps": list(t.steps),
                "abs_max": [_finite_or_none(v) for v in t.abs_max],
                "grad_abs_max": [_finite_or_none(v) for v in t.grad_abs_max],
                "tiny_share": list(t.tiny_share),
                "doubling_steps": t.doubling_steps, "overflow_step": t.overflow_step,
                "limit": t.limit, "message": t.line(),
            }
            for t in run.forecast
        ]
    return training


def _loss_scale(report: Report) -> dict[str, Any] | None:
    window = report.loss_scale
    if window is None:
        return None
    return {
        "current": window.current,
        "window": None
        if window.high is None
        else [None if window.low is None else 2.0**window.low, 2.0**window.high],
        "recommended_init_scale": None if window.recommended is None else 2.0**window.recommended,
        "max_grad": window.max_abs,
    }


def _extent(m: RangeMap, extent: Extent | None) -> dict[str, Any] | None:
    if extent is None:
        return None
    room = m.headroom(extent)
    return {
        "abs_max": extent.abs_max,
        "headroom": None if room is None or math.isinf(room) else room,
        "values": extent.values,
        "below_normal": extent.tiny,
        "below_normal_share": extent.tiny_share,
        "nonfinite": extent.nonfinite,
        "overflowed": extent.overflowed,
    }


def _headroom(m: RangeMap | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "format": m.format,
        "limit": m.limit,
        "smallest_normal": m.smallest_normal,
        "loss_scale": m.loss_scale,
        "modules": [
            {"module": row.module, "ops": row.ops, "forward": _extent(m, row.forward),
             "backward": _extent(m, row.backward)}
            for row in m.modules
        ],
    }


def _closest(m: RangeMap | None) -> dict[str, Any] | None:
    if m is None:
        return None

    def op(o: OpRange) -> dict[str, Any]:
        return {"op": o.op, "module": o.module, "phase": o.phase,
                "location": _location(o.location)} | (_extent(m, o.extent) or {})

    return {"overflow": [op(o) for o in m.top], "underflow": [op(o) for o in m.bottom]}


def render_json(report: Report) -> str:
    return json.dumps(report_dict(report), indent=2) + "\n"
