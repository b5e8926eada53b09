"""torchrun and the ridge head: each rank adds its shard of the images to G and Q, all_reduce sums them.

Two gloo processes on the CPU fit one step on the same features; the head, G and Q equal the
one-process ones up to float64's order of summation.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file
from test_distributed import _free_port

from sbcli.engine import distributed
from sbcli.methods import ranpac

WORLD = 2


def _step_inputs() -> tuple[ranpac.RidgeState, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    centres = torch.randn(3, 24, generator=gen) * 3
    labels = torch.arange(301) % 3  # an odd count: uneven shards
    features = (centres[labels] + torch.randn(301, 24, generator=gen)).relu()
    return ranpac.RidgeState.start(24, ranpac.Config(projection=64), seed=0), features, labels


def _fit(state, features, labels):
    new, head, chosen = ranpac.fit_step(state, features, labels, 3, None, seed=1)
    return {"gram": new.gram, "targets": new.targets, "head": head}, chosen


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    with distributed.session("cpu"):
        assert distributed.info().world_size == WORLD
        seen: list[int] = []
        chunks = ranpac._accumulate_chunks

        def counted(gram, targets, features, *rest):
            seen.append(len(features))
            return chunks(gram, targets, features, *rest)

        ranpac._accumulate_chunks = counted  # this process only: how many rows this rank added
        tensors, chosen = _fit(*_step_inputs())
        tensors["rows"] = torch.tensor(seen)
        tensors["ridge"] = torch.tensor([chosen["ridge"], chosen["temperature"]])
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(Path(out_dir) / f"rank{rank}.safetensors"))


@pytest.mark.usefixtures("one_thread")
def test_two_ranks_sum_their_shards_into_the_one_process_head(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    alone, chosen = _fit(*_step_inputs())
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(WORLD)]
    held = int(ranpac.held_back_split(_step_inputs()[2], ranpac.HELD_BACK, 1, ranpac.MAX_HELD_BACK).sum())
    fit_rows = 301 - held
    # each rank added its own half of the fit rows, then of all the rows; together every row once
    assert [r["rows"].tolist() for r in ranks] == [[-(-fit_rows // 2), 151], [fit_rows // 2, 150]]
    for r in ranks:
        assert r["ridge"].tolist() == [chosen["ridge"], chosen["temperature"]]
        for key in ("gram", "targets", "head"):
            torch.testing.assert_close(r[key], alone[key].to(r[key].dtype), rtol=1e-10, atol=1e-9)
    assert torch.equal(ranks[0]["head"], ranks[1]["head"])  # every rank holds the same head
