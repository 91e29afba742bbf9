"""Record a real torch.profiler export of a 2-rank CPU run (gloo): what a user brings.

    python record.py OUT          # writes OUT/rank-0.json.gz and OUT/rank-1.json.gz

Each rank trains a small MLP under DistributedDataParallel (gradient all-reduces from DDP's
autograd hooks) with SGD for 4 steps; torch.profiler records steps 2 and 3 (schedule wait=1,
warmup=1, active=2) with record_shapes, with_stack and with_modules, as docs/kineto.md
recommends. Inside each profiled step the script also issues a broadcast, an all_gather and
a send/recv pair (rank 0 -> rank 1), so the export holds collectives and P2P of several kinds.
"""
import gzip
import os
import shutil
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        return self.head(self.blocks(x))


def train(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = nn.parallel.DistributedDataParallel(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    path = os.path.join(out, f"rank-{rank}.json")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_stack=True,
                 with_modules=True, schedule=schedule(wait=1, warmup=1, active=2),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(4):
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            flag = torch.ones(4)
            dist.broadcast(flag, src=0)
            gathered = [torch.empty(4) for _ in range(world)]
            dist.all_gather(gathered, flag * rank)
            if rank == 0:
                dist.send(torch.arange(8.0), dst=1)
            else:
                dist.recv(torch.empty(8), src=0)
            prof.step()
    dist.destroy_process_group()
    with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(path)


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(train, args=(2, port, out), nprocs=2)


if __name__ == "__main__":
    main()
