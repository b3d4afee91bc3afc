"""A pre-norm transformer block (nn.MultiheadAttention, GELU MLP), the
layer of the small LMs that test_compile.py compiles and real_gpu.py
measures. It imports only torch, so a GPU machine without metamem runs it."""

import torch


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                       torch.nn.Linear(4 * width, width))

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm(x))
