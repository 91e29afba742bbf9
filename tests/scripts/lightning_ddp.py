"""Lightning's BoringModel demo with its default (automatic) optimization, DDP with gloo over
the ranks trace-run launches, 2 optimizer steps: Lightning runs each training step's forward
and backward inside ``optimizer.step(closure)``. A collective counter of its own
(collective_counter.py) counts what ran: OUT/counts-<rank>.json.
Usage: trace-run --nproc-per-node 2 lightning_ddp.py OUT"""
import os
import sys

from collective_counter import CollectiveCounter, rank

counter = CollectiveCounter().install_below()

import lightning.pytorch as pl  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

out = sys.argv[1]
pl.seed_everything(0, verbose=False)
trainer = pl.Trainer(
    accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"),
    max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
    enable_model_summary=False, default_root_dir=os.path.join(out, "lightning"))
trainer.fit(BoringModel(), DataLoader(RandomDataset(32, 8), batch_size=2))
counter.dump(os.path.join(out, f"counts-{rank()}.json"))
