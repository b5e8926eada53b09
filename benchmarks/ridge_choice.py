"""What choosing RanPAC's ridge strength costs: one eigendecomposition of G against the coarse-to-fine search.

``--method ranpac`` picks lambda at every step from a grid of 23 candidates by the squared error of
the head on a held-back fifth of the new images (:func:`sbcli.methods.ranpac.choose_ridge`). The
search can decompose G once (``torch.linalg.eigh``) and score every candidate with matrix products,
or factorise ``G + lambda I`` by Cholesky at every third candidate and then beside the best (12 of
23). This times both, alternately, on the same random-projection features (``--images`` rows of
``--features`` dimensions projected to ``--projection``, ``--classes`` classes), checks that they
choose the same lambda, and prints one JSON object with the median seconds of each and their ratio.

Example (the figure in CHANGELOG.md and docs/method.md)::

    python benchmarks/ridge_choice.py --rounds 3 --projection 2000
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sbcli.methods import ranpac


def by_eigh(gram: torch.Tensor, targets: torch.Tensor, held_h: torch.Tensor, held_y: torch.Tensor) -> float:
    """The grid's best lambda from one eigendecomposition of G (every candidate then in a product)."""
    values, vectors = torch.linalg.eigh(gram)
    rotated_q, rotated_h = vectors.T @ targets, held_h @ vectors
    errors = [float(((rotated_h @ (rotated_q / (values + r)[:, None]) - held_y) ** 2).mean()) for r in ranpac.RIDGE_GRID]
    return ranpac.RIDGE_GRID[errors.index(min(errors))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1200)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--projection", type=int, default=2000)
    parser.add_argument("--classes", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(0, args.classes, (args.images,), generator=gen)
    means = torch.randn(args.classes, args.features, generator=gen)
    feats = means[labels] + 2.0 * torch.randn(args.images, args.features, generator=gen)
    h = ranpac.project(feats, ranpac.random_projection(args.features, args.projection, 0))
    y = ranpac.one_hot(labels, args.classes)
    held = ranpac.held_back_split(labels, ranpac.HELD_BACK, 0)
    gram, targets = ranpac.accumulate(torch.zeros(args.projection, args.projection, dtype=torch.float64),
                                      torch.zeros(args.projection, args.classes, dtype=torch.float64), h[~held], y[~held])
    times: dict[str, list[float]] = {"eigh": [], "coarse_to_fine": []}
    chosen: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, choose in (("eigh", by_eigh), ("coarse_to_fine", ranpac.choose_ridge)):
            start = time.perf_counter()
            chosen[name] = choose(gram, targets, h[held], y[held])
            times[name].append(time.perf_counter() - start)
    eigh_s, fine_s = statistics.median(times["eigh"]), statistics.median(times["coarse_to_fine"])
    print(json.dumps({"projection": args.projection, "threads": torch.get_num_threads(), "rounds": args.rounds,
                      "eigh_s": round(eigh_s, 2), "coarse_to_fine_s": round(fine_s, 2),
                      "ratio": round(eigh_s / fine_s, 1), "same_choice": chosen["eigh"] == chosen["coarse_to_fine"],
                      "ridge": chosen["coarse_to_fine"]}))


if __name__ == "__main__":
    main()
