"""Deferred weight gradients for zero-bubble pipeline schedules (Qi et al. 2023).

ZB-H1 splits a backward pass into B (gradient of the input, on the critical path between
stages) and W (gradient of the weights, needed only by the optimizer). During B the linear
layers compute their input gradient and push a closure computing their weight gradient here;
``flush`` closes the micro-batch and ``pop`` runs its closures in a later W pass. Megatron's
zero-bubble store is a class-level singleton; this one is owned by the pipeline stage.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

import torch

WeightGradFn = Callable[[], None]


class WeightGradStore:
    """FIFO of per-micro-batch lists of weight-gradient closures."""

    def __init__(self) -> None:
        self._current: list[WeightGradFn] = []
        self._queue: deque[list[WeightGradFn]] = deque()
        # Called with each parameter whose gradient a W pass has just accumulated (the data
        # parallel reducer counts these like autograd's post-accumulate-grad hooks).
        self.on_grad_ready: Callable[[torch.nn.Parameter], None] = lambda param: None

    def put(self, fn: WeightGradFn) -> None:
        self._current.append(fn)

    def flush(self) -> None:
        """End of a B pass: its closures become one W pass."""
        self._queue.append(self._current)
        self._current = []

    def pop(self) -> None:
        """Run the oldest pending W pass."""
        for fn in self._queue.popleft():
            fn()

    def __len__(self) -> int:
        return len(self._queue)


def accumulate_grad(param: torch.nn.Parameter, grad: torch.Tensor, store: WeightGradStore) -> None:
    """param.grad += grad, then tell the store's listener (autograd is bypassed here)."""
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)
    store.on_grad_ready(param)
