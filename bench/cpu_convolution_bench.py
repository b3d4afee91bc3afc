"""What recording oneDNN's CPU convolutions costs a trace: a torchvision
model's training step (forward, backward, SGD) traced on a fake cpu with
oneDNN off (the native kernels, modelled), with oneDNN on at the process's
first such trace (each distinct convolution and its backward run once for
real on zeros, recorded) and again (the recordings kept), beside the real
step with oneDNN on.

    PYTHONPATH=build/python .venv/bin/python bench/cpu_convolution_bench.py [--model resnet50] [--batch 32] [--size 224]
"""

import argparse
import time

import torch
import torchvision

import metamem


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    model = getattr(torchvision.models, args.model)()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        model(torch.randn(args.batch, 3, args.size, args.size)).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed(what, run):
        start = time.perf_counter()
        peak = run()
        print(f"{what:48s} {time.perf_counter() - start:7.2f} s  peak {peak:,} B", flush=True)

    def traced():
        with metamem.trace(device="cpu", modules=[model]) as t:
            step()
        return t.peak_bytes

    print(f"{args.model}, batch {args.batch} @ {args.size}², {torch.get_num_threads()} threads, torch {torch.__version__}")
    with torch.backends.mkldnn.flags(enabled=False):
        timed("trace, oneDNN off (native kernels)", traced)
    timed("trace, oneDNN on, first (recording)", traced)
    timed("trace, oneDNN on, again (recorded)", traced)
    timed("real step, oneDNN on (achieved_cpu)", lambda: metamem.achieved_cpu(step, [model]))


if __name__ == "__main__":
    main()
