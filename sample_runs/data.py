"""Training data: the prose in sample_runs/data/, read as bytes (a byte-level tokenizer,
vocabulary 256), cut into random windows that are identical for every parallel layout."""
from __future__ import annotations

from pathlib import Path

import torch

from sample_runs.parallel.pipeline_parallel import MicroBatch

CORPUS_PATH = Path(__file__).parent / "data" / "corpus.txt"
BYTE_VOCAB = 256


def load_corpus(path: Path = CORPUS_PATH) -> torch.Tensor:
    """Token ids of the corpus: one id per byte."""
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()


def decode(ids: torch.Tensor) -> str:
    return bytes(ids.tolist()).decode("utf-8", errors="replace")


def microbatches(corpus: torch.Tensor, *, step: int, seed: int, seq_len: int,
                 micro_batch_size: int, num_microbatches: int, dp_rank: int, dp_size: int,
                 device: torch.device) -> list[MicroBatch]:
    """This DP rank's micro-batches of iteration ``step``.

    The global batch of d*m*b windows is drawn from one generator seeded by (seed, step), and
    DP rank r takes micro-batches r*m .. r*m+m-1 of it; so d ranks with m micro-batches see the
    same data as one process with d*m micro-batches.
    """
    gen = torch.Generator().manual_seed(seed * 7919 + step)
    global_batch = dp_size * num_microbatches * micro_batch_size
    starts = torch.randint(0, len(corpus) - seq_len - 1, (global_batch,), generator=gen)
    mine = starts.view(dp_size, num_microbatches, micro_batch_size)[dp_rank]
    offsets = torch.arange(seq_len + 1)
    batches = []
    for row in mine:
        window = corpus[row.unsqueeze(1) + offsets]  # (b, s+1)
        batches.append(MicroBatch(tokens=window[:, :-1].to(device),
                                  targets=window[:, 1:].t().contiguous().to(device)))
    return batches


def context_parallel_split(batches: list[MicroBatch], positions: torch.Tensor) -> list[MicroBatch]:
    """This CP rank's tokens of each micro-batch: the sequence positions it holds (its two
    load-balanced chunks, context_parallel.load_balanced_positions). (b, s/c) and (s/c, b)."""
    positions = positions.to(batches[0].tokens.device) if batches else positions
    return [MicroBatch(tokens=mb.tokens[:, positions], targets=mb.targets[positions])
            for mb in batches]
