"""How well ``nan-hunter run``'s forecast predicts an overflow, and what its sampling costs.

    python benchmarks/forecast.py              # both parts (~2 minutes on 2 CPU cores)
    python benchmarks/forecast.py --accuracy   # the three scripts only
    python benchmarks/forecast.py --cost       # the sampling cost only (--quick: a small model)

**Accuracy.** Three training scripts of different shapes whose activations grow steadily (a
learnable gain or logit scale that a regulariser with the wrong sign keeps pushing up, as a
temperature drifting up in training does): an MLP (``tests/run_scripts/growing_gain_train.py``),
a convolutional net whose feature maps grow, and an attention block whose logit scale grows.
Each runs under ``nan-hunter run --forecast-every 5`` (CPU autocast, float16) until its real
overflow (the problem step ``run`` reports). Printed: the step of the first forecast warning, the
step it predicted, the real overflow step, and the error relative to the real step; the same for
the last forecast before the overflow (the report's trend). Target: within 20%.

**Cost.** The sampling's cost at ~31.6M parameters (``models.build_transformer``: 10 layers of
d_model 512), training in float32 on the CPU (the fastest step a CPU runs, so the sampling's
share of it is the largest): plain steps (A) and sampled steps (B: ``RangeSampler`` attached for
the forward, its values collected after the backward) in ABBA order per block. The per-block
ratio B / A is the cost of a sampled step; the run samples one step in ``--forecast-every``
(default 50), so the cost per step is ``(ratio - 1) / 50``. Printed: the median ratio, its 95%
bootstrap interval (blocks resampled), and that per-step cost. Target: under 1%.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from models import build_transformer  # noqa: E402

from nan_hunter.training.forecast import DEFAULT_EVERY, RangeSampler  # noqa: E402

TARGET_ERROR = 0.20
TARGET_COST = 0.01

CONV = '''
import torch
from torch import nn


class GainConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.gain = nn.Parameter(torch.tensor(1.0))
        self.body = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.stem(x)) * self.gain
        h = self.body(h)
        return self.head(h.mean((2, 3)))


torch.manual_seed(0)
model = GainConv()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
x = torch.randn(4, 3, 8, 8) * 2.0
for step in range(600):
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = out.float().pow(2).mean() * 1e-9 - 0.05 * model.gain.pow(2)
    opt.zero_grad()
    loss.backward()
    opt.step()
'''

ATTENTION = '''
import torch
from torch import nn


class ScaledAttention(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.qk = nn.Linear(d, 2 * d)
        self.logit_scale = nn.Parameter(torch.tensor(1.0))
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        q, k = self.qk(x).chunk(2, dim=-1)
        scores = (q @ k.transpose(-2, -1)) * self.logit_scale
        return self.proj(scores.softmax(-1) @ x), scores


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = ScaledAttention()
        self.score_head = nn.Linear(6, 1)

    def forward(self, x):
        y, scores = self.attn(x)
        return y.mean() + self.score_head(scores).mean() * 1e-6


torch.manual_seed(0)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.5)
x = torch.randn(2, 6, 16)
for step in range(600):
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(x)
    loss = out.float() * 1e-9 - 0.04 * model.attn.logit_scale.pow(2)
    opt.zero_grad()
    loss.backward()
    opt.step()
'''

WARNING = re.compile(r"training step (\d+): (.*) around step ([\d,]+)")


def _accuracy_one(name: str, script: Path) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "nan_hunter", "run", "--forecast-every", "5",
             "--no-save-repro", "--format", "json", "-o", str(report), str(script)],
            capture_output=True, text=True, cwd=folder, timeout=900,
        )
        data = json.loads(report.read_text()) if report.exists() else {}
    warned = next((WARNING.search(line) for line in done.stderr.splitlines()
                   if "warning:" in line and "overflows" in line), None)
    training = data.get("training", {})
    real = training.get("problem_step")
    first = (int(warned.group(1)), int(warned.group(3).replace(",", ""))) if warned else None
    last = training.get("forecast", [{}])[0].get("overflow_step") if training.get(
        "forecast") else None
    return {
        "script": name, "real_overflow_step": real, "exit": done.returncode,
        "first_warning_step": first[0] if first else None,
        "first_prediction": first[1] if first else None,
        "first_error": abs(first[1] - real) / real if first and real else None,
        "last_prediction": last,
        "last_error": abs(last - real) / real if last and real else None,
        "module": training.get("forecast", [{}])[0].get("module") if training.get(
            "forecast") else None,
    }


def accuracy() -> list[dict[str, object]]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        scripts = {
            "mlp (gain on hidden)": ROOT / "tests" / "run_scripts" / "growing_gain_train.py",
            "conv (gain on feature maps)": Path(folder) / "growing_conv.py",
            "attention (growing logit scale)": Path(folder) / "growing_attention.py",
        }
        scripts["conv (gain on feature maps)"].write_text(textwrap.dedent(CONV))
        scripts["attention (growing logit scale)"].write_text(textwrap.dedent(ATTENTION))
        for name, script in scripts.items():
            row = _accuracy_one(name, script)
            rows.append(row)
            first, last = row["first_error"], row["last_error"]
            print(f"{name:34s} overflow at step {row['real_overflow_step']}; first warning at "
                  f"step {row['first_warning_step']} predicted {row['first_prediction']} "
                  f"({_pct(first)} off); last forecast {row['last_prediction']} "
                  f"({_pct(last)} off); module {row['module']}", flush=True)
    ok = all(isinstance(r["first_error"], float) and r["first_error"] <= TARGET_ERROR
             for r in rows)
    print(f"first forecast within {TARGET_ERROR:.0%} on {sum(1 for r in rows if isinstance(r['first_error'], float) and r['first_error'] <= TARGET_ERROR)}/{len(rows)} scripts"  # noqa: E501
          + ("" if ok else " (target missed)"))
    return rows


def _pct(value: object) -> str:
    return f"{100 * value:.1f}%" if isinstance(value, float) else "n/a"


def cost(quick: bool, blocks: int) -> dict[str, float]:
    torch.manual_seed(0)
    model, x = build_transformer(quick)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    sampler = RangeSampler(tiny=6.1e-5)

    def step(sampled: bool) -> float:
        start = time.perf_counter()
        if sampled:
            sampler.attach(model)
        out = model(x)
        if sampled:
            sampler.detach()
        loss = out.float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if sampled:
            sampler.collect(0)
        opt.step()
        return time.perf_counter() - start

    for _ in range(2):  # warm-up
        step(False)
        step(True)
    ratios = []
    for block in range(blocks):
        order = (False, True, True, False) if block % 2 == 0 else (True, False, False, True)
        times = {False: 0.0, True: 0.0}
        for sampled in order:
            times[sampled] += step(sampled)
        ratios.append(times[True] / times[False])
    median = statistics.median(ratios)
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    low, high = boots[int(0.025 * len(boots))], boots[int(0.975 * len(boots)) - 1]
    per_step = (median - 1) / DEFAULT_EVERY
    print(f"sampling cost at {params / 1e6:.1f}M parameters: a sampled step takes {median:.3f}x "
          f"a plain one (95% interval {low:.3f} .. {high:.3f}, {len(ratios)} blocks); one step "
          f"in {DEFAULT_EVERY} sampled: {100 * per_step:+.2f}% per step (interval "
          f"{100 * (low - 1) / DEFAULT_EVERY:+.2f}% .. {100 * (high - 1) / DEFAULT_EVERY:+.2f}%)"
          + ("" if per_step < TARGET_COST else " (target missed)"))
    return {"params": params, "ratio": median, "low": low, "high": high,
            "per_step": per_step}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--accuracy", action="store_true")
    parser.add_argument("--cost", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a small model for the cost")
    parser.add_argument("--blocks", type=int, default=8)
    args = parser.parse_args()
    both = not args.accuracy and not args.cost
    if args.accuracy or both:
        accuracy()
    if args.cost or both:
        cost(args.quick, args.blocks)


if __name__ == "__main__":
    main()
