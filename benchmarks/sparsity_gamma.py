"""Calibrate gamma for ``--sparsity paper`` against the code form's gamma = 1.

The two forms of S&B's sparsity penalty have very different scales: the code form is a group
lasso normalised per tensor and combined as a self-weighted mean, the paper form a plain sum of
the twelve cross blocks' L2 norms. The code form's gamma = 1 is the authors' value; the paper form
gets the gamma that gives it the same strength at the start of phase A, measured here as

    ratio = code(W) / paper(W)    (penalty values)   and   ||grad code(W)|| / ||grad paper(W)||

on freshly initialised networks (the paper's ResNet-18 at full width and ResNet-32), over seeds
and the class splits of the paper's benchmarks (C_old of C_total with the paper's rho). Prints one
row per case and the median of each ratio; no training, a few seconds on a CPU.

    python benchmarks/sparsity_gamma.py
"""

from __future__ import annotations

import argparse
import statistics

import torch

from sbcli.nets import create_model
from sbcli.nets.partition import make_partition, sparsity_code, sparsity_paper

# (classes per task, tasks, rho): CIFAR-100 and Tiny-ImageNet steps 2 of the paper's table
SPLITS = ((50, 2, 1.0), (20, 5, 1.35), (10, 10, 1.15), (100, 2, 1.0), (40, 5, 1.35), (20, 10, 1.2))


def ratios(arch: str, seed: int, per_task: int, rho: float) -> tuple[float, float]:
    """(value ratio, gradient-norm ratio) code / paper at initialisation, step 2 of a sequence."""
    torch.manual_seed(seed)
    model = create_model(arch, 2 * per_task)
    partition = make_partition(model, rho, per_task)
    weights = [layer.module.weight for layer in model.partitioned_layers()]
    values, grads = [], []
    for form in (sparsity_code, sparsity_paper):
        value = form(model, partition)
        grad = torch.autograd.grad(value, weights)
        values.append(float(value))
        grads.append(float(torch.sqrt(sum((g * g).sum() for g in grad))))
    return values[0] / values[1], grads[0] / grads[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--archs", nargs="+", default=["resnet18", "resnet32"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| arch | seed | C_old/C_total | rho | code/paper value | code/paper gradient |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = []
    for arch in args.archs:
        for seed in args.seeds:
            for per_task, tasks, rho in SPLITS:
                value, grad = ratios(arch, seed, per_task, rho)
                rows.append((arch, value, grad))
                print(f"| {arch} | {seed} | {per_task}/{2 * per_task} (of {tasks} tasks) | {rho} | {value:.4f} | {grad:.4f} |")
    for arch in args.archs:
        mine = [r for r in rows if r[0] == arch]
        print(f"{arch}: median code/paper value ratio {statistics.median(r[1] for r in mine):.4f}, "
              f"gradient ratio {statistics.median(r[2] for r in mine):.4f} over {len(mine)} cases")


if __name__ == "__main__":
    main()
