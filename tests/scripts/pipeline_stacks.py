"""torch.distributed.pipelining's pipeline() under the tracer (2 ranks, gloo): a model of 4
blocks split into 2 stages at ``blocks.2`` by pipeline() itself (torch.export, run by
torch.fx.Interpreter), GPipe over 4 micro-batches, one step. Its ops must carry the model's
own source lines (tests/integration/test_stacks_fx.py).
Usage: torchrun --nproc-per-node 2 pipeline_stacks.py OUT"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import tracer

M, WIDTH, BLOCKS = 4, 8, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h) + x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(BLOCKS)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def main() -> None:
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint, pipeline
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    x, target = torch.randn(2 * M, WIDTH), torch.randn(2 * M, WIDTH)
    pipe = pipeline(Model(), mb_args=(x[:2],),
                    split_spec={f"blocks.{BLOCKS // 2}": SplitPoint.BEGINNING})
    schedule = ScheduleGPipe(pipe.build_stage(rank, torch.device("cpu")), M, loss_fn=loss_fn)
    tracer.step()
    if rank == 0:
        schedule.step(x)                                   # STEP LINE 0
    else:
        schedule.step(target=target)                       # STEP LINE 1
    tracer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    with tracer.trace(sys.argv[1]):
        main()
