"""A torchrun training script with FSDP2, as people write them, for
`metamem run --nproc-per-node N --rank R` (tests/python/test_run.py):
the process group from torchrun's environment (NCCL on GPUs, gloo on
CPUs), LOCAL_RANK's GPU, a DistributedSampler, each layer and the model
fully sharded (with --ddp, the model under DistributedDataParallel
instead), AdamW, the loss logged by rank 0, a barrier and the group
destroyed at the end.

    torchrun --nproc-per-node 2 tests/python/torchrun_training_script.py --epochs 2 [--ddp]
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--ddp", action="store_true", help="DistributedDataParallel instead of FSDP2")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 128), torch.randint(0, 10, (256,)))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(device)
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    else:
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (inputs, labels) in enumerate(loader):
            loss = F.cross_entropy(model(inputs.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if rank == 0 and step % 2 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
