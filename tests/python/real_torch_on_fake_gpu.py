"""Real PyTorch on a fake GPU: what torch 2.x holds in its caching allocator
beside tensors, measured from the pinned wheel itself.

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

    PYTHONPATH=build/python .venv/bin/python tests/python/real_torch_on_fake_gpu.py build/oracle

Exits 77 (ctest's skip) naming why where the fake libraries were not built,
1 where a measurement differs from metamem's model.
"""
import json
import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import ctypes, json, sys, threading
    gpu = json.loads(sys.argv[2])
    ctypes.CDLL(sys.argv[1]).metamem_fake_cuda_set_device(
        gpu["name"].encode(), ctypes.c_size_t(gpu["total_memory"]), gpu["major"], gpu["minor"],
        gpu["multi_processor_count"], gpu["L2_cache_size"])
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


def measure(oracle, gpu):
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(os.path.join(oracle, lib) for lib in
                                 ("libmetamem_fake_cuda_preload.so", "libmetamem_fake_cublas.so"))
    env["LD_LIBRARY_PATH"] = os.path.join(oracle, "driver") + ":" + env.get("LD_LIBRARY_PATH", "")
    run = subprocess.run([sys.executable, "-c", CHILD, os.path.join(oracle, "libmetamem_fake_cuda_preload.so"),
                          json.dumps(gpu)], env=env, capture_output=True, text=True, timeout=300)
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
    import metamem._metamem as native
    failures = 0
    for key in native.gpu_keys():
        gpu = native.gpu(key)
        workspace = gpu["cublas_workspace_bytes"]
        expected = {"first product": workspace, "second product": 0, "backward": 0, "another thread": 0,
                    "another stream": workspace, "cuBLASLt, bf16 with bias": 0}
        seen = measure(oracle, gpu)
        for what, bytes_ in expected.items():
            ok = seen[what] == bytes_
            failures += not ok
            print(f"{key:<10} {what:<26} {seen[what]:>11,} B beyond its tensors"
                  f"{'' if ok else f'  DIFFERS: metamem says {bytes_:,}'}")
    print(f"{len(native.gpu_keys())} GPUs; {failures} measurements differ from metamem's model")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
