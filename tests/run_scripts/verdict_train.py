"""A training script for ``nan-hunter run``'s verdicts on a problem step, unaware of nan-hunter.

A small classifier trained with SGD; at step 4 one thing goes wrong, chosen by ``--case``:

- ``overflow``: FP16 autocast on the CPU; the batch is scaled by 1e5, so ``self.inp(x)`` passes
  65504 (finite in FP32): a precision problem.
- ``fp32-nan``: FP32; the batch's first feature is 0 and ``torch.log`` of it is -inf: a real
  bug.
- ``one-off``: FP32; the model counts its calls and its 4th forward returns NaN, once: not
  reproducible (a transient fault).
- ``grad-hook``: FP32; a gradient hook on the output layer's weight writes NaN into its
  gradient, after the model's forward and backward: outside the model's forward.

``--dataclass``: the model returns a plain ``@dataclass`` holding its logits.
"""

import argparse
from dataclasses import dataclass

import torch
from torch import nn

BAD_STEP = 4


@dataclass
class Output:
    logits: torch.Tensor


class Net(nn.Module):
    def __init__(self, as_dataclass: bool) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.out = nn.Linear(32, 4)
        self.as_dataclass = as_dataclass
        self.calls = 0
        self.fault_at = -1

    def forward(self, x: torch.Tensor) -> torch.Tensor | Output:
        self.calls += 1
        h = self.inp(x)  # culprit
        gate = torch.log(x[:, :1])  # log-culprit
        h = h * 1e-4 + gate
        if self.calls == self.fault_at:
            h = h * float("nan")  # a one-off fault
        logits = self.out(h)
        return Output(logits) if self.as_dataclass else logits


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=("overflow", "fp32-nan", "one-off", "grad-hook"),
                        required=True)
    parser.add_argument("--dataclass", action="store_true")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net(args.dataclass)
    if args.case == "one-off":
        model.fault_at = BAD_STEP
    step = 0

    def poison(grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan") if step == BAD_STEP else grad

    if args.case == "grad-hook":
        model.out.weight.register_hook(poison)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for step in range(1, args.steps + 1):
        x = torch.rand(8, 16) + 1.0
        y = torch.randint(0, 4, (8,))
        if step == BAD_STEP and args.case == "overflow":
            x = x * 1e5
        if step == BAD_STEP and args.case == "fp32-nan":
            x[:, 0] = 0.0
        with torch.autocast("cpu", dtype=torch.float16, enabled=args.case == "overflow"):
            out = model(x)
            logits = out.logits if args.dataclass else out
            loss = nn.functional.cross_entropy(logits.float(), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    print("done")


if __name__ == "__main__":
    main()
