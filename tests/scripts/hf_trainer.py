"""The Hugging Face Trainer on a tiny GPT-2 built from a GPT2Config (no download), DDP with gloo
over the ranks trace-run launches, 2 optimizer steps. A collective counter of its own
(collective_counter.py) counts what ran: OUT/counts-<rank>.json.
Usage: trace-run --nproc-per-node 2 hf_trainer.py OUT
       trace-run --no-launcher hf_trainer.py OUT cuda     (one process on the GPU: gpu_checks.sh)"""
import os
import sys

from collective_counter import CollectiveCounter, rank

counter = CollectiveCounter().install_below()

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

out = sys.argv[1]
on_gpu = sys.argv[2:] == ["cuda"]
torch.manual_seed(0)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)
tokens = torch.randint(0, config.vocab_size, (8, 16), generator=torch.Generator().manual_seed(1))
data = [{"input_ids": ids, "labels": ids} for ids in tokens]
args = TrainingArguments(
    output_dir=os.path.join(out, f"hf-{rank()}"), per_device_train_batch_size=2, max_steps=2,
    logging_steps=1, report_to=[], save_strategy="no", use_cpu=not on_gpu,
    ddp_backend=None if on_gpu else "gloo",
    dataloader_num_workers=0, disable_tqdm=True, seed=0)
Trainer(model=model, args=args, train_dataset=data).train()
counter.dump(os.path.join(out, f"counts-{rank()}.json"))
