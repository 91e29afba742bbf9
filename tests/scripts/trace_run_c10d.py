"""Plain c10d training on gloo, unaware of paratrace (but for --flushed-in): DDP-style manual
gradient all-reduce.

Flags: --steps N; --raise-on RANK (that rank raises at step 1); --kill RANK (SIGKILLs itself at
step 1, once --flushed-in DIR, when given, holds its status file and its trace with the end of
step 0: what the test reads then does not depend on how soon the flusher ran); --hang RANK
(skips the step-1 all-reduce, then sleeps); --linger RANK (after the last step and
destroy_process_group, that rank loops on time.sleep while the others exit); --late RANK (that
rank sleeps --late-by S seconds before init_process_group); --sleep S (pause per step).
"""
import argparse
import os
import signal
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--raise-on", type=int, default=None)
parser.add_argument("--kill", type=int, default=None)
parser.add_argument("--flushed-in", default=None)
parser.add_argument("--hang", type=int, default=None)
parser.add_argument("--linger", type=int, default=None)
parser.add_argument("--late", type=int, default=None)
parser.add_argument("--late-by", type=float, default=6.0)
parser.add_argument("--sleep", type=float, default=0.0)
args = parser.parse_args()



def wait_until_flushed(traces: str, rank: int) -> None:
    """Until this rank's status file exists and its trace on disk holds the end of step 0 (the
    tracer's flusher has written them; trace-run records this script under it)."""
    import tracer
    status = os.path.join(traces, f"rank-{rank}.status.json")
    trace = os.path.join(traces, f"rank-{rank}.arrow")
    while True:
        try:
            if os.path.exists(status) and any(r["op"] == "paratrace::step"
                                              for r in tracer.load(trace).records()):
                return
        except tracer.TraceError:
            pass                       # not written yet
        time.sleep(0.01)


assert __name__ == "__main__"
if int(os.environ["RANK"]) == args.late:
    time.sleep(args.late_by)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    x = torch.randn(4, 8)
    loss = model(x).pow(2).mean()
    loss.backward()
    if step == 1 and rank == args.raise_on:
        raise ValueError(f"boom on rank {rank}")
    if step == 1 and rank == args.kill:
        if args.flushed_in:
            wait_until_flushed(args.flushed_in, rank)
        os.kill(os.getpid(), signal.SIGKILL)
    if step == 1 and rank == args.hang:
        time.sleep(3600)
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
    time.sleep(args.sleep)
    print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
while rank == args.linger:
    time.sleep(0.5)
