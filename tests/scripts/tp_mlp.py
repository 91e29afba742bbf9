"""The small MLP the tensor-parallel test scripts shard: ``up`` column-wise, ``down`` row-wise."""
import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))
