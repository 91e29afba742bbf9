"""Plain c10d training on gloo (a manual gradient all-reduce per parameter), unaware of
paratrace, that leaves, forks or blocks on request: the hostile and unlucky endings of
tests/integration/test_trace_run_exits.py.

Flags: --steps N (0: until it is ended); --exit RANK --how os|sys --code N (that rank leaves with os._exit(N) or
sys.exit(N) in step --at, after its backward and before its all-reduces); --fork (each rank
forks a child that ignores SIGTERM and waits in C); --deaf (every rank ignores SIGTERM);
--marker DIR (each rank writes DIR/rank-R.json with its pid and its child's once its first
step is done).
"""
import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--exit", type=int, default=None)
parser.add_argument("--how", choices=("os", "sys"), default="os")
parser.add_argument("--code", type=int, default=0)
parser.add_argument("--at", type=int, default=2)
parser.add_argument("--fork", action="store_true")
parser.add_argument("--deaf", action="store_true")
parser.add_argument("--marker", default=None)
args = parser.parse_args()


def fork_child() -> int:
    """A child that ignores SIGTERM and waits in C (pause) until killed."""
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True:
            signal.pause()
    return pid


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if args.deaf:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = fork_child() if args.fork else None
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while args.steps == 0 or step < args.steps:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    if rank == args.exit and step == args.at:
        os._exit(args.code) if args.how == "os" else sys.exit(args.code)
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
    print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    if step == 0 and args.marker:
        path = os.path.join(args.marker, f"rank-{rank}.json")
        with open(path + ".tmp", "w") as fh:
            json.dump({"pid": os.getpid(), "child": child}, fh)
        os.replace(path + ".tmp", path)
    if args.steps == 0:
        time.sleep(0.05)          # trains until it is ended: gently
    step += 1
dist.destroy_process_group()
