"""A few training steps of a small generator with the PyTorch drop-in modules.

``onednn_convt.torch.ConvTranspose2d`` subclasses ``torch.nn.ConvTranspose2d`` (same
constructor, parameters, initialization and state_dict) and runs the forward and both
gradients on oneDNN through this package; ``swap_modules(model)`` switches the modules of an
existing model in place. Here a small DCGAN-style generator is trained for a few SGD steps
to fit fixed images; the first step's loss and gradients are checked against the same
network in plain PyTorch, and the loss must go down.

Needs PyTorch (CPU build): without it the example says so and exits successfully.

    python examples/torch_training.py            # batch 16, 10 steps
    python examples/torch_training.py --small    # batch 4, 3 steps, narrow layers (CI)
"""

from __future__ import annotations

import argparse
import copy
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", default=bool(os.environ.get("ONEDNN_CONVT_EXAMPLES_SMALL")),
                        help="small sizes, a second or two (also ONEDNN_CONVT_EXAMPLES_SMALL=1)")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("skipped: PyTorch is not installed (pip install torch)")
        return 0
    from onednn_convt.torch import swap_modules

    batch, nz, ngf, steps = (4, 8, 4, 3) if args.small else (16, 64, 32, 10)
    torch.manual_seed(0)

    def generator() -> torch.nn.Sequential:  # z (N, nz, 1, 1) -> (N, 3, 32, 32)
        return torch.nn.Sequential(
            # no bias before a BatchNorm (it would cancel it), as in DCGAN
            torch.nn.ConvTranspose2d(nz, 4 * ngf, 4, 1, 0, bias=False), torch.nn.BatchNorm2d(4 * ngf), torch.nn.ReLU(),
            torch.nn.ConvTranspose2d(4 * ngf, 2 * ngf, 4, 2, 1, bias=False), torch.nn.BatchNorm2d(2 * ngf),
            torch.nn.ReLU(),
            torch.nn.ConvTranspose2d(2 * ngf, ngf, 4, 2, 1, bias=False), torch.nn.BatchNorm2d(ngf), torch.nn.ReLU(),
            torch.nn.ConvTranspose2d(ngf, 3, 4, 2, 1), torch.nn.Tanh(),
        )

    plain = generator()
    model = swap_modules(copy.deepcopy(plain))  # the same parameters, on onednn_convt
    print(f"swapped: {type(model[0]).__module__}.{type(model[0]).__name__}")
    z = torch.randn(batch, nz, 1, 1)
    target = torch.rand(batch, 3, 32, 32) * 2 - 1

    # one step of each network from the same parameters: the same loss and gradients
    for net in (plain, model):
        net.zero_grad()
        torch.nn.functional.mse_loss(net(z), target).backward()
    worst = max(float((a.grad - b.grad).abs().max() / b.grad.abs().max().clamp_min(1e-30))
                for a, b in zip(model.parameters(), plain.parameters()))
    print(f"first step: largest gradient difference against plain PyTorch {worst:.1e} (relative)")
    assert worst < 1e-3, worst

    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(z), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print("losses: " + ", ".join(f"{v:.4f}" for v in losses))
    assert losses[-1] < losses[0], losses
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
