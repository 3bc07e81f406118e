"""From a rule's ``FixPlan`` to a ``Fix``: edits on the user's files, rendered once as a diff.

The rule chooses the template and the applicability; this module turns the plan into edits
(an FP32 region around the culprit statement, or the one-token rewrites a rule asks for) and
renders them relative to the project root.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from nan_hunter.findings import Applicability, Edit, Finding, Fix, Phase, SourceLocation
from nan_hunter.fixes.autocast_region import build_autocast_region_patch
from nan_hunter.fixes.clamp_region import MARGIN, build_clamp_patch
from nan_hunter.fixes.edits import (
    EditConflict,
    by_file,
    combine,
    edits_between,
    render_diff,
)
from nan_hunter.fixes.function_region import build_function_region_patch
from nan_hunter.fixes.kept_submodule import LibraryScope, build_kept_submodule_edits
from nan_hunter.fixes.module_region import build_kept_module_patch
from nan_hunter.fixes.op_region import build_op_region_patch
from nan_hunter.fixes.rewrites import (
    bce_with_logits,
    custom_function_fp32,
    finfo_limit,
    scalar_literal,
)
from nan_hunter.fixes.source_file import read_source
from nan_hunter.fixes.tail_upcast import UpcastSite, build_tail_upcast_patch
from nan_hunter.precision.formats import LOW_PRECISION
from nan_hunter.project.paths import is_installed, project_root, shared_root
from nan_hunter.rules.registry import Candidate, FixPlan
from nan_hunter.trace.events import OpEvent
from nan_hunter.trace.flops import MATMUL_OPS


def make_fix(
    title: str, applicability: Applicability, edits: tuple[Edit, ...], root: Path
) -> Fix:
    """A fix whose diff is rendered from ``edits`` (display-only when there are none)."""
    if not edits:
        return Fix(title=title, applicability=Applicability.DISPLAY_ONLY)
    return Fix(title=title, applicability=applicability, edits=edits,
               diff=render_diff(edits, root))


def edit_site(event: OpEvent) -> SourceLocation | None:
    """Where a fix for ``event`` goes: its own line when that is in the user's code, else
    the nearest call site in the user's project (the op ran in an installed library)."""
    if event.location is None:
        return None
    if event.in_user_code and not is_installed(event.location.file):
        return event.location
    return event.call_site


def build_fix(
    c: Candidate,
    plan: FixPlan,
    *,
    device: str,
    site: SourceLocation | None,
    half_dtype: str | None = None,
    root_class: str | None = None,
    library: LibraryScope | None = None,
    device_from_input: bool = False,
) -> Fix:
    """The fix for one finding. ``site`` is where the edit goes: the op's own line in the
    user's project, or the call site in it when the op ran inside an installed library;
    ``root_class``, the class name of the model itself (never kept in FP32 as a whole);
    ``library``, for an op inside an installed library, the modules around it that hooks
    from the user's file can keep in FP32 (tried first, narrowest first: the call-site
    region keeps the whole library call in FP32). A plan
    whose edit cannot be made falls back to ``plan.fallback``; ``plan.alternatives`` whose
    edits can be made become the fix's alternatives, except those that change the cause itself
    (``FixPlan.leads``: a constant FP16 cannot hold), which come first. With
    ``device_from_input`` an FP32 region names the device of a tensor entering it
    (``device_type=x.device.type``), ``device`` only when it cannot."""
    fix = _build(c, plan, device, site, half_dtype, from_input=device_from_input)
    if not fix.edits and plan.fallback is not None:
        fix = _build(c, plan.fallback, device, site, half_dtype, from_input=device_from_input)
    built = [
        (p, alt) for p in plan.alternatives
        if (alt := _build(c, p, device, site, half_dtype, from_input=device_from_input)).edits
    ]
    alternatives = tuple(alt for p, alt in built if not p.leads)
    wider: list[Fix] = []
    if plan.region and fix.edits and half_dtype is None:
        # The region's result may still be beyond the format's range when it leaves the
        # region; an op after it that autocast runs in low precision then overflows in its
        # place. The region plus FP32 regions for those ops: verification picks it when the
        # narrow one fails.
        carried = _build(c, plan, device, site, half_dtype, downstream=True,
                         from_input=device_from_input)
        if carried.edits and carried.edits != fix.edits:
            wider.append(carried)
    if plan.region and fix.edits:
        # The same region grown to the statements producing its inputs: when the gradient
        # that the region sends back into an FP16 producer overflows (NH401 at the dtype
        # boundary), this is the fix; verification picks it when the narrow one fails.
        grown = _build(c, plan, device, site, half_dtype, grow=True,
                       from_input=device_from_input)
        if grown.edits and grown.edits != fix.edits:
            title = f"{grown.title}, with the statements producing its inputs"
            wider.append(replace(grown, title=title))
    if plan.region and plan.extra_lines and c.cast_inputs and half_dtype is None and fix.edits:
        # The operand autocast cast down arrived in FP32: a region around the culprit alone
        # keeps it so, and the producer's statement (a Linear beside the exp that overflowed)
        # stays under autocast. Tried first; with the regions its out-of-range result needs.
        alone_plan = replace(
            plan, extra_lines=(), upcast_sites=(),
            title=f"Run {c.event.op} in FP32 (autocast disabled): its FP32 operand is no "
                  "longer cast down, the statements producing it stay as they are",
        )
        finer = [
            f for f in (
                _build(c, alone_plan, device, site, half_dtype, from_input=device_from_input),
                _build(c, alone_plan, device, site, half_dtype, downstream=True,
                       from_input=device_from_input),
            ) if f.edits and f.edits != fix.edits
        ]
        finer = [f for i, f in enumerate(finer) if all(f.edits != g.edits for g in finer[:i])]
        if finer:
            wider = [*finer[1:], fix, *wider]
            fix = finer[0]
    whole = _whole_function(c, plan, device, site, half_dtype, root_class)
    if whole is not None and all(whole.edits != f.edits for f in (fix, *wider)):
        wider.append(whole)
    clamped = _clamped(c, plan, site, half_dtype)
    if clamped is not None:  # before the grown region and the kept module: it moves nothing
        wider.insert(0, clamped)
    if not fix.edits and wider:  # no narrow edit could be made: the wider one leads
        fix, wider = wider[0], wider[1:]
    alone = _op_alone(c, plan, device, site, half_dtype)
    if alone is not None and fix.edits and alone.edits != fix.edits:
        # finer than the statement: tried first, the statement region after it
        fix, wider = alone, [fix, *wider]
    # the culprit alone, where the op-alone candidate is not made (it takes its statement's
    # only op: ``h = h.float() * self.scale``), and the elementwise ops that rounded its input
    # (the op-alone candidate leaves them in low precision): no matmul/conv moved, tried first
    tail = None if alone is not None and not c.rounded_chain else (
        _elementwise_tail(c, plan, site, half_dtype)
    )
    if tail is not None and fix.edits and tail.edits != fix.edits:
        fix, wider = tail, [fix, *wider]
    alternatives = (*wider, *alternatives)
    leads = [alt for p, alt in built if p.leads]
    if leads:  # the change of the cause itself comes first, the regions after it
        alternatives = (*leads[1:], *(f for f in (fix, *alternatives) if f.edits))
        fix = leads[0]
    kept = _kept_submodules(c, plan, device, site, half_dtype, library)
    if kept and library is not None:
        # the regions at the call site keep the whole library call in FP32: after the hooks
        region = [replace(f, fp32_module=library.call) for f in (fix, *alternatives) if f.edits]
        fix, alternatives = kept[0], (*kept[1:], *region)
    return replace(fix, alternatives=alternatives) if alternatives else fix


def _kept_submodules(
    c: Candidate,
    plan: FixPlan,
    device: str,
    site: SourceLocation | None,
    half_dtype: str | None,
    library: LibraryScope | None,
) -> list[Fix]:
    """Autocast, an op inside an installed library: each module of ``library`` (narrowest
    first) kept in FP32 by hooks that the user's file registers where it builds the model
    (``nan_hunter.fixes.kept_submodule``)."""
    if (
        library is None or half_dtype is not None or not plan.region or plan.rewrite
        or not c.ref_finite or site is c.event.location
    ):
        return []
    where = library.site
    root = project_root(where.file.resolve())
    fixes = []
    for path, class_name in library.modules:
        edits = build_kept_submodule_edits(where, path, device_type=device, fmt=c.fmt.name)
        if edits is None:
            return []
        title = (
            f"Keep {path} ({class_name}) in FP32 from {where.function}(): hooks disable "
            f"autocast for it alone and cast its inputs to float32 (the library is not edited)"
        )
        fixes.append(replace(make_fix(title, plan.applicability, edits, root), fp32_module=path))
    return fixes


def _op_alone(
    c: Candidate,
    plan: FixPlan,
    device: str,
    site: SourceLocation | None,
    half_dtype: str | None,
) -> Fix | None:
    """The culprit op taken out of a statement that computes more than it, into an FP32
    region of its own (``nan_hunter.fixes.op_region``); its result cast back where its FP32
    values fit the format. Under ``model.half()``: upcast operands, and the value always cast
    back, taking along the ops of the statement up to the one that brings an out-of-range
    result back into range. None where that cannot be made or is the statement region."""
    if (
        not plan.region or plan.rewrite or site is None
        or not c.ref_finite or site is not c.event.location or c.reference is None
    ):
        return None
    path = Path(site.file).resolve()
    root = project_root(path)
    fits = _result_fits(c)
    consumers: tuple[OpEvent, ...] = ()
    if half_dtype is not None and not fits:
        consumers = _back_in_range_on_line(c, site)
        if not consumers:
            return None  # nothing in the statement brings it back: it cannot be cast back
    patch = build_op_region_patch(
        path,
        site.line,
        c.event.op,
        len(c.event.inputs),
        device_type=device,
        relative_to=root,
        uncast_operands=frozenset(
            i for i, s in enumerate(c.event.inputs) if s.dtype not in LOW_PRECISION
        ),
        cast_back=fits,
        half=half_dtype is not None,
        consumers=tuple(e.op for e in consumers),
    )
    if patch is None:
        return None
    if half_dtype is not None:
        along = (f", with the {' and '.join(e.op for e in consumers)} that brings it back "
                 f"into {c.fmt.name}'s range" if consumers else "")
        title = (f"Compute {c.event.op} alone in FP32{along} (its {c.fmt.name} operands "
                 f"upcast, the result cast back; the rest of its statement stays in "
                 f"{c.fmt.name})")
        return make_fix(title, plan.applicability, patch.edits, root)
    back = ", its result cast back" if fits else ""
    title = (f"Compute {c.event.op} alone in FP32 (autocast disabled for that call only{back}; "
             f"the rest of its statement stays in {c.fmt.name})")
    return make_fix(title, plan.applicability, patch.edits, root)


def _result_fits(c: Candidate) -> bool:
    """The culprit's FP32 result is within the format's range (it may be cast back)."""
    return c.reference is not None and all(
        s.abs_max is not None and s.abs_max <= c.fmt.max for s in c.reference.outputs
    )


def _heavy(event: OpEvent) -> bool:
    """A matmul/conv: what autocast casts down, and what a fix should keep in FP16."""
    return event.op.rsplit(".", 1)[-1] in MATMUL_OPS


def _elementwise_tail(
    c: Candidate, plan: FixPlan, site: SourceLocation | None, half_dtype: str | None
) -> Fix | None:
    """The culprit (a backward finding's forward op: its backward then runs in FP32) and,
    when FP32 fails on its own rounded inputs, the ops that rounded them
    after the last matmul/conv on the way, computed in FP32 by upcasting the values where they
    enter (``self.score(x).float() * 1.0``): autocast runs an elementwise op in its inputs'
    dtype, so no region is needed and no matmul FLOPs move
    (``nan_hunter.fixes.tail_upcast``). Under autocast a matmul culprit is cast down again
    whatever its inputs: not offered for it. Under ``model.half()`` the value goes back to the
    model's dtype at the culprit where its FP32 result fits the format, else at the first op
    after it that brings it back into range (the softmax after overflowing scores). None where
    the edit cannot be made."""
    forward = c.phase is Phase.FORWARD
    if (
        not plan.region or plan.rewrite or site is None or (forward and c.reference is None)
        or site is not c.event.location or not c.ref_finite
        or (half_dtype is None and _heavy(c.event))
    ):
        return None
    boundary = max((e.index for e in c.rounded_chain if _heavy(e)), default=-1)
    tail = {e.index: e for e in c.rounded_chain if e.index > boundary}
    tail[c.event.index] = c.event
    if any(e.location is None or e.location.file != site.file for e in tail.values()):
        return None
    cast_back: tuple[int, str] | None = None
    if half_dtype is not None:
        # a backward finding's forward ran in the format and was finite: its result fits
        fits = not forward or _result_fits(c)
        back = c.event if fits else next(
            (e for e in c.out_of_range_consumers if e.index in c.back_in_range), None
        )
        if back is None or back.location is None or back.location.file != site.file:
            return None  # its FP32 result cannot go back to the model's dtype
        cast_back = (back.location.line, back.op)
    sites: list[UpcastSite] = []
    for e in sorted(tail.values(), key=lambda e: e.index):
        entering = frozenset(
            i for i, s in enumerate(e.inputs)
            if s.dtype in LOW_PRECISION
            and (i >= len(e.producers) or e.producers[i] not in tail)
        )
        if entering:
            assert e.location is not None
            left = frozenset(range(len(e.inputs))) - entering
            sites.append((e.location.line, e.op, len(e.inputs), left))
    if not sites:
        return None
    path = Path(site.file).resolve()
    root = project_root(path)
    patch = build_tail_upcast_patch(path, sites, relative_to=root, cast_back=cast_back)
    if patch is None:
        return None
    before = [e.op for e in sorted(tail.values(), key=lambda e: e.index) if e is not c.event]
    ops = (f"{', '.join(dict.fromkeys(before))} up to {c.event.op}" if before
           else c.event.op)
    back_at = ""
    if cast_back is not None:
        back_at = (f", the result cast back at {cast_back[1]}" if cast_back[1] != c.event.op
                   or cast_back[0] != site.line else ", its result cast back")
    backward = "" if forward else ", so that its backward runs in FP32 too"
    inputs = (f"their {c.fmt.name} inputs upcast where they leave the last matmul/conv or "
              "module" if before else f"its {c.fmt.name} inputs upcast")
    title = (f"Compute {ops} in FP32{backward}: {inputs}{back_at} (no region; the matmuls "
             f"around stay in {c.fmt.name})")
    return make_fix(title, plan.applicability, patch.edits, root)


_SUMS = frozenset({"add", "radd", "iadd", "sub", "rsub", "isub"})


def _clamped(
    c: Candidate, plan: FixPlan, site: SourceLocation | None, half_dtype: str | None
) -> Fix | None:
    """Under ``model.half()``: a sum whose FP32 values are beyond the format's range (a
    residual stream's outlier) computed in FP32 and clamped to the format's finite range before
    it is cast back (``nan_hunter.fixes.clamp_region``). Unsafe: it changes the FP16 values
    beyond the range (in FP32 it changes nothing, which verification measures)."""
    if (
        half_dtype is None or not plan.region or plan.rewrite or site is None
        or site is not c.event.location or not c.ref_finite
        or c.event.op.rsplit(".", 1)[-1].strip("_") not in _SUMS
        or (c.ref_abs_max or 0.0) <= c.fmt.max
    ):
        return None
    path = Path(site.file).resolve()
    root = project_root(path)
    patch = build_clamp_patch(
        path, site.line, c.event.op, len(c.event.inputs), relative_to=root,
        uncast_operands=frozenset(
            i for i, s in enumerate(c.event.inputs) if s.dtype not in LOW_PRECISION
        ),
    )
    if patch is None:
        return None
    title = (f"Clamp the sum to {c.fmt.name}'s finite range: computed in FP32, clamped to "
             f"±(finfo.max - {MARGIN}) when it came in as {c.fmt.name}, cast back "
             "(changes only values the format cannot hold)")
    return make_fix(title, Applicability.UNSAFE, patch.edits, root)


def _back_in_range_on_line(c: Candidate, site: SourceLocation) -> tuple[OpEvent, ...]:
    """The ops of the culprit's line that take its out-of-range result, in order, up to the
    first whose FP32 values are back in the format's range; () when there is none."""
    chain: list[OpEvent] = []
    for event in c.out_of_range_consumers:
        where = event.location
        if where is None or where.file != site.file or where.line != site.line:
            continue
        chain.append(event)
        if event.index in c.back_in_range:
            return tuple(chain)
    return ()


def _whole_function(
    c: Candidate,
    plan: FixPlan,
    device: str,
    site: SourceLocation | None,
    half_dtype: str | None,
    root_class: str | None,
) -> Fix | None:
    """The last step of the search before modelling advice: the function holding the culprit
    (a submodule's ``forward``) with autocast disabled (``nan_hunter.fixes.function_region``).
    Not for the root module, whose forward is the whole model (FP32 everywhere is no fix), nor
    under ``model.half()``, where there is no autocast to disable: there the module holding
    the culprit is kept in FP32 (``nan_hunter.fixes.module_region``)."""
    if not plan.region or site is None or not c.ref_finite:
        return None
    if not c.event.module:
        return None
    path = Path(site.file).resolve()
    if half_dtype is not None:
        return _kept_module(plan, path, site.line, half_dtype.removeprefix("torch."), root_class)
    patch = build_function_region_patch(
        path, site.line, dtype=c.fmt.name, device_type=device, relative_to=project_root(path)
    )
    if patch is None:
        return None
    title = (
        f"Run the function holding {c.event.op} (in {c.event.module}) in FP32: "
        f"autocast disabled for all of it, its {c.fmt.name} tensor arguments cast to float32"
    )
    return make_fix(title, plan.applicability, patch.edits, project_root(path))


def _kept_module(
    plan: FixPlan, path: Path, line: int, dtype: str, root_class: str | None
) -> Fix | None:
    """Under ``model.half()``: the module whose method holds the culprit keeps its parameters
    and buffers in FP32 however the model is cast, upcasts its inputs and casts its results
    back (transformers' ``_keep_in_fp32_modules``, written into the module). Not the model's
    own class: all of it in FP32 is no fix. Named by its class: where the op ran in a library
    module (an ``nn.Linear``), the method holding the line is that of an ancestor the trace
    does not name."""
    return _kept_module_fix(None, path, line, dtype, plan.applicability, root_class)


def _kept_module_fix(
    module: str | None,
    path: Path,
    line: int,
    dtype: str,
    applicability: Applicability,
    root_class: str | None = None,
) -> Fix | None:
    root = project_root(path)
    kept = build_kept_module_patch(path, line, dtype=dtype, relative_to=root)
    if kept is None or kept.class_name == root_class:
        return None
    name = f"{kept.class_name} ({module})" if module else kept.class_name
    title = (
        f"Keep {name} in FP32 under .half(): its parameters and buffers stay float32 "
        f"when the model is cast, its {dtype} inputs are upcast and its results cast back"
    )
    return make_fix(title, applicability, kept.region.edits, root)


def with_kept_module(finding: Finding, dtype: str) -> Finding:
    """``finding`` (a parameter or buffer of a submodule that the cast to ``dtype`` ruins,
    NH005) with, as an alternative to verify, the submodule kept in FP32 by its class (the
    line of the finding is where the class sets the tensor up)."""
    where = finding.location
    if where is None or not finding.module or is_installed(where.file):
        return finding
    kept = _kept_module_fix(
        finding.module, Path(where.file).resolve(), where.line, dtype, Applicability.SAFE
    )
    if kept is None:
        return finding
    if finding.fix is None:
        return replace(finding, fix=kept)
    return replace(finding, fix=replace(
        finding.fix, alternatives=(*finding.fix.alternatives, kept)
    ))


MASK_CONSTANT = "-1e4"
"""A mask constant FP16 holds and that stays finite after an add or a subtraction."""


def with_fp16_constant(finding: Finding, fmt_name: str) -> Finding:
    """``finding`` (NH005: a 0-dim parameter or buffer whose value FP16 cannot hold) with, first
    among the fixes to verify, the literal it is made from on its definition line written as a
    mask constant FP16 holds (``torch.tensor(-1e10)`` -> ``torch.tensor(-1e4)``). Unsafe: it
    changes what the model computes; verification measures by how much. Only for a negative
    constant (a mask value): a large positive scale is the model's own number."""
    where = finding.location
    if (
        where is None or finding.fix is None or len(finding.inputs) != 1
        or is_installed(where.file)
    ):
        return finding
    stats = finding.inputs[0]
    if stats.numel != 1 or stats.min is None or stats.min >= 0 or stats.abs_max is None:
        return finding
    path = Path(where.file).resolve()
    new_text = scalar_literal(path, where.line, stats.min, MASK_CONSTANT)
    if new_text is None:
        return finding
    edits = edits_between(path, read_source(path).text, new_text)
    title = (f"Use {MASK_CONSTANT} instead of {stats.min:.2e}: {fmt_name} holds it, and a mask "
             "value stays finite after the add or subtraction that follows (changes the "
             "numerics)")
    constant = make_fix(title, Applicability.UNSAFE, edits, project_root(path))
    return replace(finding, fix=replace(
        finding.fix, alternatives=(constant, *finding.fix.alternatives)
    ))


_REWRITES = {
    "finfo": lambda path, line, plan, device: finfo_limit(path, line, plan.value),
    "bce_logits": lambda path, line, plan, device: bce_with_logits(path, line),
    "scalar": lambda path, line, plan, device: scalar_literal(
        path, line, plan.value, plan.literal
    ),
    "custom_function": lambda path, line, plan, device: custom_function_fp32(path, line, device),
}


def _build(
    c: Candidate,
    plan: FixPlan,
    device: str,
    site: SourceLocation | None,
    half_dtype: str | None,
    grow: bool = False,
    downstream: bool = False,
    from_input: bool = False,
) -> Fix:
    # The file itself, not a link to it (a project file linked from elsewhere, or an unedited
    # file in the verification's mirror): its project root holds the path the edits name.
    if site is not None and plan.rewrite:
        if plan.rewrite == "custom_function" and half_dtype is not None:
            # torch.amp's decorators act under autocast only: after .half() they change nothing
            return _advice(_half_custom_function(c, half_dtype), c, half_dtype)
        path = Path(site.file).resolve()
        new_text = _REWRITES[plan.rewrite](path, plan.rewrite_line or site.line, plan, device)
        if new_text is None:
            return _advice(plan.title, c, half_dtype)
        edits = edits_between(path, read_source(path).text, new_text)
        return make_fix(plan.title, plan.applicability, edits, project_root(path))
    if site is None or not plan.region or not c.ref_finite:
        return _advice(plan.title, c, half_dtype)
    path = Path(site.file).resolve()
    root = project_root(path)
    in_library = site is not c.event.location
    patch = build_autocast_region_patch(
        path,
        site.line,
        c.event.op if not in_library else "<call>",
        len(c.event.inputs) if not in_library else 0,
        producer_lines=() if in_library else plan.extra_lines,
        device_type=device,
        relative_to=root,
        upcast_sites=() if in_library else (
            *plan.upcast_sites, *(_consumer_sites(c, path) if half_dtype else ())
        ),
        # the trace knows every operand's dtype: only low-precision floats get .float()
        uncast_operands=frozenset(
            i for i, s in enumerate(c.event.inputs)
            if s.dtype not in LOW_PRECISION and not in_library
        ),
        consumer_lines=_consumer_lines(c, path) if half_dtype and not in_library else (),
        cast_back=half_dtype,
        grow_to_producers=grow,
        device_from_input=from_input,
    )
    if patch is None:
        return _advice(plan.title, c, half_dtype)
    title = plan.title
    edits = patch.edits
    if half_dtype is not None:
        title = title.replace("(autocast disabled)", f"(FP32 inputs, results cast back to "
                              f"{half_dtype.removeprefix('torch.')})")
    elif downstream:
        found = _downstream_regions(
            c, path, device, (patch.first_line, patch.last_line), from_input
        )
        if not found or not found[0]:
            return _advice(plan.title, c, half_dtype)
        regions, root = found
        where = sorted({_place(site, path) for site, _ in regions})
        title = (f"{title}; its result stays beyond {c.fmt.name}'s range, so the "
                 f"{c.fmt.name} ops taking it ({', '.join(where)}) run in FP32 too")
        edits = (*edits, *(e for _, region in regions for e in region))
        try:
            for same_file in by_file(edits).values():
                combine(same_file)
        except EditConflict:
            return _advice(plan.title, c, half_dtype)
    return make_fix(title, plan.applicability, edits, root)


def _downstream_regions(
    c: Candidate, path: Path, device: str, covered: tuple[int, int], from_input: bool = False
) -> tuple[list[tuple[SourceLocation, tuple[Edit, ...]]], Path] | None:
    """Autocast: the region's result is still beyond the format's range in the FP32 reference,
    and an op after the region (the caller of the culprit's module, in this file or another of
    the project; the next statement of another block) ran in low precision on it: autocast
    would cast it down there and the overflow moves to that op. Each such op gets an FP32
    region of its own (ops of one block share one). The regions, with the root the diff is
    rendered against (the one folder all the files share); None when one cannot be made."""
    sites: list[tuple[Path, int, OpEvent]] = []
    for event in c.out_of_range_consumers:
        if not any(s.dtype == c.fmt.name for s in event.outputs):
            continue  # autocast ran it in FP32 already (a softmax, a sum): nothing to do
        where = edit_site(event)
        if where is None:
            continue
        file = Path(where.file).resolve()
        if file != path or not covered[0] <= where.line <= covered[1]:
            sites.append((file, where.line, event))
    root = shared_root([path, *(file for file, _, _ in sites)])
    regions: list[tuple[SourceLocation, tuple[Edit, ...]]] = []
    spans: dict[Path, list[tuple[int, int]]] = {path: [covered]}
    for file, line, event in sorted(sites, key=lambda item: (str(item[0]), item[1])):
        if any(first <= line <= last for first, last in spans.get(file, [])):
            continue
        own = event.location is not None and event.location.line == line and event.in_user_code
        patch = build_autocast_region_patch(
            file,
            line,
            event.op if own else "<call>",
            len(event.inputs) if own else 0,
            device_type=device,
            relative_to=root,
            consumer_lines=[other for f, other, _ in sites if f == file and other > line],
            device_from_input=from_input,
        )
        if patch is None:
            return None
        spans.setdefault(file, []).append((patch.first_line, patch.last_line))
        regions.append((SourceLocation(str(file), line, ""), patch.edits))
    return regions, root


def _half_custom_function(c: Candidate, half_dtype: str) -> str:
    name = c.event.op.removesuffix(".apply")
    return (
        f"Compute {name}'s forward and backward in FP32: .float() on the tensors they read "
        f"(inputs, saved tensors, incoming gradients), results cast back to "
        f"{half_dtype.removeprefix('torch.')}"
    )


def _place(site: SourceLocation, culprit_file: Path) -> str:
    """``line 12`` in the culprit's file, ``model.py:12`` in another."""
    if Path(site.file) == culprit_file:
        return f"line {site.line}"
    return f"{Path(site.file).name}:{site.line}"


def _advice(title: str, c: Candidate, half_dtype: str | None) -> Fix:
    """A display-only fix. Under ``model.half()`` there is no autocast to disable: the advice
    names the module to keep in FP32 (its FP16 parameters are what the op computes with)."""
    if half_dtype is not None and "(autocast disabled)" in title:
        if c.event.module:
            keep = (
                f"(keep {c.event.module} in FP32 after .half(): "
                f"model.get_submodule({c.event.module!r}).float(), and give it .float() inputs)"
            )
        else:
            keep = "(.float() inputs: under .half() there is no autocast to disable)"
        title = title.replace("(autocast disabled)", keep)
    return Fix(title=title, applicability=Applicability.DISPLAY_ONLY)


def _consumer_lines(c: Candidate, path: Path) -> tuple[int, ...]:
    return tuple(line for line, _, _ in _consumer_sites(c, path))


def _consumer_sites(c: Candidate, path: Path) -> tuple[tuple[int, str, int], ...]:
    """The ops after the culprit (same file) that still see its out-of-range values, and the
    one that brings them back: a half-mode region runs down to them, and their FP16 operands
    are upcast like the culprit's (``s.softmax(-1) @ v`` needs ``v.float()``)."""
    return tuple(
        (e.location.line, e.op, len(e.inputs)) for e in c.out_of_range_consumers
        if e.location is not None and Path(e.location.file).resolve() == path
    )
