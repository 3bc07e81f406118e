"""``run_steps``: the CLI's ``--steps N``. Trains a copy of the target on its batch, checks each
step as ``watch`` does, and scans the first step that breaks from the weights at its start."""

from __future__ import annotations

import copy
import dataclasses
import math

import torch

from nan_hunter.core.batch import Batch, LossFn
from nan_hunter.core.progress import announce
from nan_hunter.engine.traced_forward import default_loss
from nan_hunter.errors import NOT_THE_MODELS, ConfigError, UserCodeError, first_line
from nan_hunter.findings import Report
from nan_hunter.precision.formats import format_for
from nan_hunter.precision.lost_updates import LOST_SHARE, LostUpdates, UpdateSnapshot
from nan_hunter.project.config import Settings
from nan_hunter.project.loader import Target
from nan_hunter.project.options import explicitly_set
from nan_hunter.trace import torch_originals as real
from nan_hunter.training.checks import ScaleWatch, bad_grad_names, grads_finite_flag
from nan_hunter.training.events import StepsResult
from nan_hunter.training.step_verdict import step_verdict

DEFAULT_LR = 1e-3
"""Adam's learning rate in ``run_steps`` when neither the call nor the settings give one."""
NO_GRADIENT = "--steps trains the model, but it has no trainable parameter that gets a gradient"


def _batch_copy(batch: Batch, device: str, dtype: torch.dtype | None = None) -> Batch:
    """A copy of ``batch`` on ``device`` (floating tensors in ``dtype`` when given), fresh for
    each step: a model or loss that writes into its inputs must not change the next step's."""

    def move(x: torch.Tensor) -> torch.Tensor:
        cast = dtype if dtype is not None and x.is_floating_point() else x.dtype
        return x.to(device=device, dtype=cast, copy=True)

    return batch.map(move)


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run_steps(
    target: Target,
    settings: Settings,
    steps: int,
    *,
    lr: float | None = None,
    skip_patience: int = 3,
    scale_floor: float = 1.0,
) -> StepsResult:
    """Train a deep copy of ``target.model`` for up to ``steps`` Adam steps on ``target.batch``
    and scan the first step that breaks, as ``watch`` checks it. The learning rate is ``lr``,
    else the ``lr`` setting when the configuration has one, else ``DEFAULT_LR`` (1e-3).

    Training runs on the scan's device under real ``torch.autocast`` in the scan's dtype, with
    a GradScaler (dynamic, as in training) whose initial scale is ``settings.grad_scale``
    (default 2**16; ``none``: no GradScaler). ``mode: half`` puts model and batch in that dtype,
    without autocast and without a GradScaler (it cannot unscale FP16 gradients). The scan of a
    bad step starts from the weights at the start of that step, restored into a fresh copy of
    the model (with a GradScaler, at the scale that step ran with). Each update of
    low-precision parameters (``mode: half``) is checked for updates lost to rounding until one
    loses half or more (``precision.lost_updates``): that step is the scan's NH604.
    ``target.model`` is left bit-identical; the run holds a copy of the model, one of its state
    and Adam's two moments.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"--steps must be a whole number >= 1, got {steps!r}")
    if lr is None:
        lr = float(getattr(settings, "lr", DEFAULT_LR))
    if not math.isfinite(lr) or lr <= 0:
        raise ConfigError(f"lr must be a finite number > 0, got {lr!r}")
    device = settings.resolved_device()
    dtype = format_for(settings.dtype).dtype
    half = settings.mode == "half"
    if half and settings.grad_scale is not None:
        if explicitly_set(settings, "grad_scale"):
            raise ConfigError(
                "--steps with --mode half cannot use --grad-scale: GradScaler does not unscale "
                "FP16 gradients"
            )
        settings = dataclasses.replace(settings, grad_scale=None)
    model = copy.deepcopy(target.model).to(device)
    if half:
        model.to(dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError(f"{NO_GRADIENT} (no parameter requires grad)")
    optimizer = torch.optim.Adam(params, lr=lr)
    scaler = torch.amp.GradScaler(device, init_scale=settings.loss_scale()) if (
        settings.grad_scale is not None
    ) else None
    scale = ScaleWatch.start(scaler, skip_patience, scale_floor) if scaler else None
    lost: LostUpdates | None = None  # the first step whose low-precision weights lost updates

    for index in range(steps):
        announce(f"training step {index + 1}/{steps}")
        start = _state(model)
        optimizer.zero_grad(set_to_none=True)
        batch = _batch_copy(target.batch, device, dtype if half else None)
        loss = _train_forward(model, batch, target.loss_fn, device, dtype, half, index)
        try:  # anomaly detection would raise on the NaN gradients the step check is for
            with torch.autograd.set_detect_anomaly(False):
                (scaler.scale(loss) if scaler is not None else loss).backward()
        except NOT_THE_MODELS:
            raise
        except BaseException as exc:
            raise UserCodeError(
                f"{type(exc).__name__} in the backward of training step {index}: "
                f"{first_line(exc)}"
            ) from exc
        if all(p.grad is None for p in params):  # GradScaler.step would assert on no gradient
            raise ConfigError(
                f"{NO_GRADIENT} (the loss of training step {index} reaches none of the "
                f"{len(params)} that require grad)"
            )
        scale_problem = None
        used = None
        grads_ok = True
        if scaler is not None and scale is not None:
            scaler.step(optimizer)
            scaler.update()
            used, _, scale_problem = scale.observe(float(scaler.get_scale()))
            loss_ok = bool(real.isfinite(loss.detach()).all())
        else:
            flag = grads_finite_flag(params)
            flags = torch.stack([real.isfinite(loss.detach()).all(), *(
                [flag.to(loss.device)] if flag is not None else [])])
            loss_ok, *rest = (bool(v) for v in flags.tolist())
            grads_ok = not rest or rest[0]
            if loss_ok and grads_ok:
                snapshot = UpdateSnapshot.take(params) if lost is None else None
                optimizer.step()
                measured = snapshot.compare(index + 1) if snapshot is not None else None
                if measured is not None and measured.share >= LOST_SHARE:
                    lost = measured
        problem = step_verdict(
            loss=loss, loss_ok=loss_ok, grads_ok=grads_ok, scaled=scaler is not None,
            scale_problem=scale_problem, bad_grads=lambda: bad_grad_names(model),
        )
        if problem is not None:
            lost = _with_master_weights(lost, target, device, dtype, lr)
            report = _scan_state(target, settings, start, used, lost)
            return StepsResult(index + 1, index, report, problem.reason, problem.detail)
    lost = _with_master_weights(lost, target, device, dtype, lr)
    final = _scan_state(target, settings, model.state_dict(), scale.used if scale else None, lost)
    return StepsResult(steps, None, final)


def _with_master_weights(
    lost: LostUpdates | None, target: Target, device: str, dtype: torch.dtype, lr: float
) -> LostUpdates | None:
    """``lost`` with what FP32 master weights do with the same updates: a fresh copy of the
    model, its parameters FP32, trained under autocast in ``dtype`` with the same Adam, up to
    the step that lost them, whose update is measured the same way (the remedy, measured)."""
    if lost is None:
        return None
    announce(f"the same {lost.step} step(s) with FP32 master weights (autocast)")
    model = copy.deepcopy(target.model).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(params, lr=lr)
    try:
        for index in range(lost.step):
            optimizer.zero_grad(set_to_none=True)
            batch = _batch_copy(target.batch, device)
            loss = _train_forward(model, batch, target.loss_fn, device, dtype, False, index)
            with torch.autograd.set_detect_anomaly(False):
                loss.backward()
            last = index + 1 == lost.step
            snapshot = UpdateSnapshot.take(params, fp32=True) if last else None
            optimizer.step()
            measured = snapshot.compare(lost.step) if snapshot is not None else None
            if measured is not None:
                return dataclasses.replace(lost, with_master=measured.share)
    except UserCodeError:  # the model does not train under autocast: not measured, not said
        return lost
    except NOT_THE_MODELS:
        raise
    except BaseException:  # its backward or Adam's step failed there: the same
        return lost
    return lost


def _scan_state(
    target: Target,
    settings: Settings,
    state: dict[str, torch.Tensor],
    scale: float | None,
    lost: LostUpdates | None,
) -> Report:
    """Scan a fresh copy of ``target.model`` holding ``state``; with a GradScaler, at the loss
    scale the step ran with (as the watcher does); ``lost``: the step whose low-precision
    weights lost their updates (NH604)."""
    from nan_hunter.engine.scan import scan_target

    fresh = copy.deepcopy(target.model)
    fresh.load_state_dict(state)
    if scale is not None:
        settings = dataclasses.replace(settings, grad_scale=scale)
    return scan_target(dataclasses.replace(target, model=fresh), settings, lost_updates=lost)


def _train_forward(
    model: torch.nn.Module,
    batch: Batch,
    loss_fn: LossFn | None,
    device: str,
    dtype: torch.dtype,
    half: bool,
    index: int,
) -> torch.Tensor:
    precision = torch.autocast(device_type=device, dtype=dtype, enabled=not half)
    try:
        with precision:
            output = model(*batch.args, **batch.kwargs)
            loss = loss_fn(output, batch.raw) if loss_fn is not None else default_loss(output)
    except NOT_THE_MODELS:
        raise
    except BaseException as exc:
        raise UserCodeError(
            f"{type(exc).__name__} in training step {index}: {first_line(exc)}"
        ) from exc
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise UserCodeError(f"loss_fn must return a scalar tensor, got {type(loss).__name__}")
    return loss.float() if half else loss
