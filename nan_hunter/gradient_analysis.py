"""Gradient underflow per module, and the loss-scale window, from the emulated backward."""

from __future__ import annotations

from nan_hunter.config import Settings
from nan_hunter.findings import Finding, Phase
from nan_hunter.precision.formats import FloatFormat
from nan_hunter.precision.gradients import FlushStats, ScaleWindow, scale_advice
from nan_hunter.rules.registry import advice_finding, get_rule
from nan_hunter.runner import PassResult
from nan_hunter.trace.stats import format_number

MIN_VALUES = 16
"""Modules with fewer nonzero gradient values than this are not judged."""


def gradient_underflow(
    low: PassResult, window: ScaleWindow | None, settings: Settings, fmt: FloatFormat
) -> list[Finding]:
    """One NH402 warning per module whose parameters' gradients lose too much in FP16."""
    rule = get_rule("NH402")
    if rule is None or not settings.rule_enabled(rule.code):
        return []
    by_module: dict[str, tuple[FlushStats, list[str]]] = {}
    for name, record in low.param_grads.items():
        stats = record.flush
        module = name.rpartition(".")[0]
        total, names = by_module.get(module, (FlushStats(0, 0, 0), []))
        by_module[module] = (total + stats, [*names, name])
    first_event = {}
    for event in low.events:
        first_event.setdefault(event.module, event)
    findings = []
    for module, (stats, names) in by_module.items():
        event = first_event.get(module)
        if event is None or stats.nonzero < MIN_VALUES:
            continue
        if stats.lost_share <= settings.grad_underflow_share:
            continue
        scale = settings.grad_scale or 1.0
        at = "without loss scaling" if scale == 1.0 else f"at loss scale {format_number(scale)}"
        advice = f"; {scale_advice(window, fmt)}" if window is not None else ""
        message = (
            f"{format_number(stats.lost_share * 100)}% of the nonzero gradient values of "
            f"{', '.join(names)} are lost in {fmt.name} {at} "
            f"({stats.vanished} vanish, {stats.subnormal} go subnormal, of {stats.nonzero})"
            f"{advice}"
        )
        title = "Use torch.amp.GradScaler"
        if window is not None and window.recommended is not None:
            title = f"Use torch.amp.GradScaler(init_scale=2**{window.recommended})"
        findings.append(
            advice_finding(
                rule,
                event,
                phase=Phase.BACKWARD,
                message=message,
                fix_title=title,
                module=module,
                stats=False,
            )
        )
    return findings
