"""A small language model of pre-norm transformer blocks (an nn.ModuleList)
trained for a few steps on random tokens, written as a script: for
`metamem run --budget` (tests/python/test_run.py), which finds the blocks
to recompute. It imports only torch and its neighbour transformer_block.

    python tests/python/block_training_script.py --steps 2 --batch-size 4
"""

import argparse

import torch
import torch.nn.functional as F

from transformer_block import Block


class LM(torch.nn.Module):
    def __init__(self, vocab, width, heads, layers):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = LM(vocab=512, width=128, heads=4, layers=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        tokens = torch.randint(0, 512, (args.batch_size, args.seq + 1))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
