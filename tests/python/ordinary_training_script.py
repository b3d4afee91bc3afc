"""An ordinary training script, as people write them, for `metamem run`
(tests/python/test_run.py): argparse, a DataLoader with workers, a
scheduler, bf16 autocast with a GradScaler, gradient clipping, tqdm, the
loss logged with .item(), a checkpoint saved with torch.save at the end.

    python tests/python/ordinary_training_script.py --epochs 2 --out /tmp/run
"""

import argparse
import os

import torch
import torch.nn.functional as F
from tqdm import tqdm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(256, 128), torch.randint(0, 10, (256,)))
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=args.epochs * len(loader))
    scaler = torch.amp.GradScaler(device)

    for epoch in range(args.epochs):
        progress = tqdm(loader, desc=f"epoch {epoch}")
        for inputs, labels in progress:
            inputs, labels = inputs.to(device), labels.to(device)
            with torch.autocast(device, torch.bfloat16):
                loss = F.cross_entropy(model(inputs), labels)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            progress.set_postfix(loss=f"{loss.item():.3f}")
    torch.save(model.state_dict(), os.path.join(args.out, "model.pt"))
    with open(os.path.join(args.out, "finished"), "w") as marker:
        marker.write("done\n")


if __name__ == "__main__":
    main()
