"""Real PyTorch on a fake GPU: what torch 2.x holds in its caching allocator
beside tensors, and whole training steps, measured from the pinned wheel
itself against metamem.

Each GPU of metamem's table runs a child Python in which the wheel's own
torch runs CUDA code on metamem's fake CUDA runtime (preloaded, with fake
cuBLAS and a fake driver: kernels and products return without computing),
so that torch.cuda.memory_allocated() is the real caching allocator's,
counting what torch's C++ allocates through it. Checked against metamem's
model (estimator/Gpu.h, cublas_workspace_bytes):

- a stream's first cuBLAS call allocates the workspace and keeps it; later
  calls on the stream, backward and other host threads allocate no other;
- another stream gets one of its own;
- cuBLASLt (a bf16 product with bias) shares it.

Sums in twelve shapes (bias gradients, a loss, batch statistics; f32,
bf16, f16) on an H100, an A100 and a T4: what each holds beyond its output
(a reduction's staging buffer and semaphores, meta/CudaReduction.h).

And whole training steps (an MLP, one with RMSNorm, convolutions of a
channels-last view; GPT-2 with matmul attention, from transformers;
torchvision's ResNet-18 and MobileNet V2 with cuDNN off; two AdamW steps)
on an H100, an A100 and a T4:
torch.cuda.max_memory_allocated() of each step, real torch's against
metamem's fake-cuda trace of the same code.

    PYTHONPATH=build/python .venv/bin/python tests/python/real_torch_on_fake_gpu.py build/oracle

Exits 77 (ctest's skip) naming why where the fake libraries were not built,
1 where a measurement differs from metamem's model.
"""
import json
import os
import subprocess
import sys
import textwrap

# A child's start (the fake runtime, argv[1], told the GPU, argv[2], before
# torch asks it) and its environment, as a trace's recordings start theirs.
from metamem._fake_gpu import PROLOGUE, command, environment

import forked_children

# For a child whose step compiles: each compile's garbage collected when it
# ends, as a trace and metamem.achieved_cpu collect it (docs/compile.md).
# Without it the real run holds what that garbage references until
# Python's next collection (torchtitan's Trainer held an int32 [8, 2048]
# block in it, docs/distributed.md). It wraps the two compile entries metamem's
# CompilingAside wraps, and collects among the objects the compile made
# alone, older ones frozen (metamem/_compile.py's
# _collecting_what_it_leaves), written out because the child runs torch
# without metamem.
COLLECTING_COMPILES = textwrap.dedent("""
    import gc
    import torch._dynamo.convert_frame as convert_frame
    from torch._functorch._aot_autograd import runtime_wrappers

    def collecting(compile_):
        def compiled(*args, **kwargs):
            gc.freeze()
            try:
                return compile_(*args, **kwargs)
            finally:
                gc.collect()
                gc.unfreeze()
        return compiled

    convert_frame._compile = collecting(convert_frame._compile)
    runtime_wrappers._AutogradBackwardCompiler.get_or_compile = collecting(
        runtime_wrappers._AutogradBackwardCompiler.get_or_compile)
""")

# Run in the child and, for the steps, under metamem.trace in this process.
STEPS = textwrap.dedent("""
    import torch

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024),
                                   torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 10)).cuda()

    def rms_mlp():
        # RMSNorm, as Llama-like models have it: fused on a GPU (one kernel,
        # its own backward), decomposed on a CPU.
        return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.RMSNorm(4096), torch.nn.GELU(),
                                   torch.nn.Linear(4096, 1024), torch.nn.RMSNorm(1024),
                                   torch.nn.Linear(1024, 10)).cuda()

    def permuted_conv():
        # Convolutions of a channels-last view, as ConvNeXt's blocks make
        # them: CUDA's own kernels copy it contiguous and answer contiguously.
        torch.backends.cudnn.enabled = False

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.proj = torch.nn.Linear(64, 64)
                self.depthwise = torch.nn.Conv2d(64, 64, 7, padding=3, groups=64)
                self.dense = torch.nn.Conv2d(64, 64, 3, padding=1)
                self.head = torch.nn.Linear(64, 10)

            def forward(self, x):  # (N, H, W, C)
                x = self.proj(x).permute(0, 3, 1, 2)
                return self.head((self.depthwise(x) + self.dense(x)).mean((2, 3)))
        return Net().cuda()

    def gpt2():
        import transformers
        config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=1000, n_positions=256,
                                         bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
        config._attn_implementation = "eager"
        return transformers.GPT2LMHeadModel(config).cuda()

    def torchvision_model(name):
        # metamem's fake cuda has no cuDNN: convolutions and batch norms take torch's own CUDA kernels,
        # which real torch takes with cuDNN off.
        import torchvision
        torch.backends.cudnn.enabled = False
        return getattr(torchvision.models, name)(num_classes=10).cuda()

    def loss(name, model):
        if name in ("resnet18", "mobilenet_v2"):
            x = torch.randn(2, 3, 64, 64, device="cuda")
            return torch.nn.functional.cross_entropy(model(x), torch.zeros(2, dtype=torch.long, device="cuda"))
        if name == "permuted_conv":
            x = torch.randn(32, 32, 32, 64, device="cuda")
            return torch.nn.functional.cross_entropy(model(x), torch.zeros(32, dtype=torch.long, device="cuda"))
        if name in ("mlp", "rms_mlp"):
            rows = 256 if name == "mlp" else 8192  # where activations, which the norms save, make the peak
            x = torch.randn(rows, 1024, device="cuda")
            return torch.nn.functional.cross_entropy(model(x), torch.zeros(rows, dtype=torch.long, device="cuda"))
        ids = torch.zeros(4, 128, dtype=torch.long, device="cuda")
        return model(ids, labels=ids).loss

    def step_peaks(name, steps=2):
        builders = {"mlp": mlp, "rms_mlp": rms_mlp, "permuted_conv": permuted_conv, "gpt2": gpt2}
        model = builders[name]() if name in builders else torchvision_model(name)
        opt = torch.optim.AdamW(model.parameters())
        peaks = []
        for _ in range(steps):
            torch.cuda.reset_peak_memory_stats()
            loss(name, model).backward()
            opt.step()
            opt.zero_grad()
            peaks.append(torch.cuda.max_memory_allocated())
        return peaks
""")
# Sums whose blocks split each output's inputs and combine through a staging
# buffer (meta/CudaReduction.h), and some whose blocks do not: what each
# allocates beyond its output, in the shapes of bias gradients, losses and
# batch statistics, in f32, bf16 and f16.
REDUCTIONS = textwrap.dedent("""
    import torch

    def staging():
        cases = [((8192, 256), [0], torch.float32), ((8192, 768), [0], torch.float32),
                 ((2, 256, 768), [0, 1], torch.float32), ((8192, 256), [0], torch.bfloat16),
                 ((8192, 256), [0], torch.float16), ((64, 2048, 2048), [2], torch.float32),
                 ((1000000,), None, torch.float32), ((512, 50257), [0], torch.float32),
                 ((4096, 1024), [1], torch.float32), ((16, 3, 224, 224), [0, 2, 3], torch.float32),
                 ((300, 7), [0], torch.float32), ((128, 4096), [0], torch.float32)]
        beyond = []
        for shape, dims, dtype in cases:
            x = torch.empty(shape, device="cuda", dtype=dtype)
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            y = x.sum() if dims is None else x.sum(dims)
            beyond.append(torch.cuda.max_memory_allocated() - before - y.untyped_storage().nbytes())
        return beyond
""")
MODELS = ("mlp", "rms_mlp", "permuted_conv", "gpt2", "resnet18", "mobilenet_v2")
STEP_GPUS = ("H100-80GB", "A100-80GB", "T4")  # each workspace size and a few architectures

CHILD = PROLOGUE + textwrap.dedent("""
    import threading
    import torch

    def beyond(make):  # bytes allocated by make() beyond the tensors it returns
        before = torch.cuda.memory_allocated()
        kept = make()
        return torch.cuda.memory_allocated() - before - sum(t.untyped_storage().nbytes() for t in kept)

    x = torch.empty(64, 1024, device="cuda")
    w = torch.empty(1024, 1024, device="cuda", requires_grad=True)
    seen = {"first product": beyond(lambda: [x @ w]), "second product": beyond(lambda: [x @ w])}
    loss = (x @ w).sum()
    seen["backward"] = beyond(lambda: (loss.backward(), [w.grad])[1])
    other = {}
    thread = threading.Thread(target=lambda: other.update(n=beyond(lambda: [x @ w])))
    thread.start()
    thread.join()
    seen["another thread"] = other["n"]
    with torch.cuda.stream(torch.cuda.Stream()):
        seen["another stream"] = beyond(lambda: [x @ w])
    xb, wb, bb = (t.to(torch.bfloat16).detach() for t in (x, w, torch.empty(1024, device="cuda")))
    seen["cuBLASLt, bf16 with bias"] = beyond(lambda: [torch.addmm(bb, xb, wb)])
    print(json.dumps(seen))
""")

CHILD_REDUCTIONS = PROLOGUE + REDUCTIONS + "print(json.dumps(staging()))\n"

# A fresh process per model, as a trace is: the first product makes the workspace.
CHILD_STEPS = PROLOGUE + textwrap.dedent("""
    exec(sys.argv[3])
    print(json.dumps(step_peaks(sys.argv[4])))
""")


# A child leaves at once when its program is done, its result printed:
# torch can abort as a process exits after a backward on the GPU ("terminate
# called without an active exception", pytorch/pytorch#38228: autograd's
# device thread, releasing its last graph task, takes the GIL of an
# interpreter that is finalizing and is unwound by pthread_exit). Without
# it, three children of test_cudnn.py's twelve H200 cases aborted so in one
# run, and the LSTM's case alone once in fourteen runs.
LEAVE = "\nimport os as _os, sys as _sys\n_sys.stdout.flush()\n_sys.stderr.flush()\n_os._exit(0)\n"


def measure(oracle, gpu, program, *args, torch_site=None, leave=True):
    """The child's last line, as JSON: `program` run by real torch on the
    fake `gpu`; the torch of the folder `torch_site` where one is given.
    With `leave` false the child ends as a process does, its exit handlers
    run (RuntimeError where it fails then, as at any point)."""
    argv, env = command(oracle, gpu, program + (LEAVE if leave else ""), *args), environment(oracle, torch_site)
    # A child that leaves at once is forked from a Python with torch imported
    # (a second of its start saved); one that runs its exit handlers starts
    # as any process does.
    run = forked_children.run(argv, env, timeout=600) if leave else \
        subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"{gpu['key']}: the child exited {run.returncode}:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.splitlines()[-1])


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    oracle = sys.argv[1]
    if not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        print(f"skipped: {oracle} holds no fake CUDA libraries (the CUDA Toolkit's headers or the torch wheel's "
              "libc10_cuda.so were missing when it was built)")
        return 77
    import metamem
    import metamem._metamem as native
    steps, reductions = {}, {}
    exec(STEPS, steps)
    exec(REDUCTIONS, reductions)
    failures = 0
    for key in native.gpu_keys():
        gpu = native.gpu(key)
        workspace = gpu["cublas_workspace_bytes"]
        expected = {"first product": workspace, "second product": 0, "backward": workspace,
                    "another thread": workspace, "another stream": workspace, "cuBLASLt, bf16 with bias": 0}
        seen = measure(oracle, gpu, CHILD)
        for what, bytes_ in expected.items():
            ok = seen[what] == bytes_
            failures += not ok
            print(f"{key:<10} {what:<26} {seen[what]:>11,} B beyond its tensors"
                  f"{'' if ok else f'  DIFFERS: metamem says {bytes_:,}'}")
        if key in STEP_GPUS:
            with metamem.trace(device="cuda", gpu=key):
                traced = reductions["staging"]()
            real = measure(oracle, gpu, CHILD_REDUCTIONS)
            ok = real == traced
            failures += not ok
            print(f"{key:<10} {'sums beyond their outputs':<26} {', '.join(f'{b:,}' for b in real)} B"
                  f"{'' if ok else f'  DIFFERS: metamem traced ' + ', '.join(f'{b:,}' for b in traced)}")
        for name in MODELS if key in STEP_GPUS else ():
            with metamem.trace(device="cuda", gpu=key):
                traced = steps["step_peaks"](name)
            real = measure(oracle, gpu, CHILD_STEPS, STEPS, name)
            ok = real == traced
            failures += not ok
            print(f"{key:<10} {name + ' AdamW steps':<26} {', '.join(f'{p:,}' for p in real)} B max allocated"
                  f"{'' if ok else f'  DIFFERS: metamem traced ' + ', '.join(f'{p:,}' for p in traced)}")
    print(f"{len(native.gpu_keys())} GPUs; {failures} measurements differ from metamem's model")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
