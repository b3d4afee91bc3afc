"""Eager training steps traced on fake cuda against the same steps run by the
pinned torch on metamem's fake GPU (real_torch_on_fake_gpu.py), per GPU and
precision (issue 47): max allocated and max reserved of each of two AdamW
steps. The models are ones no one here tuned to: compiled_models.py's
(eager), every torchvision classification and segmentation model
(torchvision_sweep.py's, "torchvision NAME"), transformers' masked LM and OPT, a
mixer with a custom autograd.Function, diffusers_sweep.py's DiT at its
reduced size, the 40 architectures of hf_sweep.py at its reduced size and
the 171 timm models of timm_sweep.py ("timm NAME"); f32 and bf16 autocast. Convolutions
and attention take cuDNN off and attention's other kernels, as
compiled_models.py says, or with --cudnn torch's defaults: cuDNN on, cuDNN
attention first on an H100, which the fake GPU runs since 2026-11-29; the
trace then takes its convolutions from the fake GPU's recordings
(trace(fake_gpu=...)), cuDNN's engines and workspaces, unless
--own-convolutions keeps metamem's models of torch's own kernels.

    METAMEM_ORACLE=build/oracle PYTHONPATH=build/python:tests/python .venv/bin/python \\
        tests/python/fake_gpu_sweep.py [--models "BERT,RegNet-Y 400MF"] [--gpus H100-80GB,T4] [--cudnn]
        [--own-convolutions] [--markdown]
        [--check]

--check exits 1 unless every run is exact. A run that differs names where:
tests/python/allocation_order.py finds the first allocation that parts.
"""
import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import compiled_models  # noqa: E402
import hf_configs  # noqa: E402
import timm_models  # noqa: E402

sys.path.insert(0, os.path.dirname(HERE))
import torchvision_sweep  # noqa: E402

BATCH = 16


class _Scale(torch.autograd.Function):
    """x * s with its own backward: saves both operands."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x, scale)
        return x * scale

    @staticmethod
    def backward(ctx, grad):
        x, scale = ctx.saved_tensors
        return grad * scale, (grad * x).sum(0)


class Mixer(torch.nn.Module):
    """An MLP-Mixer over 64 patches of width 128, its channel scale a custom
    autograd.Function."""

    def __init__(self, patches=64, width=128, depth=2):
        super().__init__()
        self.embed = torch.nn.Linear(48, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict({"norm": torch.nn.LayerNorm(width),
                                 "tokens": torch.nn.Sequential(torch.nn.Linear(patches, 256), torch.nn.GELU(),
                                                               torch.nn.Linear(256, patches)),
                                 "channels": torch.nn.Sequential(torch.nn.Linear(width, 512), torch.nn.GELU(),
                                                                 torch.nn.Linear(512, width))})
            for _ in range(depth))
        self.scale = torch.nn.Parameter(torch.ones(width))
        self.head = torch.nn.Linear(width, 10)

    def forward(self, patches):
        x = self.embed(patches)
        for block in self.blocks:
            x = x + block["tokens"](block["norm"](x).transpose(1, 2)).transpose(1, 2)
            x = x + _Scale.apply(block["channels"](block["norm"](x)), self.scale)
        return self.head(x.mean(1))


def mixer():
    def loss(model, device):
        return F.cross_entropy(model(torch.randn(BATCH, 64, 48, device=device)),
                               torch.randint(0, 10, (BATCH,), device=device))
    return Mixer(), loss


def torchvision_model(name):
    """torchvision's `name`, classification or segmentation, built and sized
    as torchvision_sweep.py builds it (10 classes; a class per pixel of a
    segmentation model's "out"), at batch 16."""
    def build():
        size = torchvision_sweep.IMAGE.get(name, 64)

        def loss(model, device):
            out = model(torch.randn(BATCH, 3, size, size, device=device))
            if isinstance(out, dict):
                out = out["out"]
            target = (BATCH,) + tuple(out.shape[2:])
            return F.cross_entropy(out, torch.randint(0, torchvision_sweep.NUM_CLASSES, target, device=device))
        return torchvision_sweep.build(name), loss
    return build


def timm_classifier(name):
    """timm's `name` (timm_models.py) at its own input size, trained as
    metamem.timm trains it: cross entropy over its classes, both heads of a
    distilled model, a backbone's features summed."""
    def build():
        import timm

        model = timm.create_model(name)
        size = model.pretrained_cfg["input_size"]

        def loss(model, device):
            x = torch.randn(BATCH, *size, device=device)
            y = torch.randint(0, max(model.num_classes, 1), (BATCH,), device=device)
            out = model(x)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            return sum(F.cross_entropy(o.float(), y) if model.num_classes else o.float().sum() for o in outs)
        return model, loss
    return build


def diffusers_dit():
    """diffusers_sweep's DiT (diffusers' DiTTransformer2DModel) at its reduced
    size, on the noise-prediction loss that sweep trains it on."""
    from diffusers import DiTTransformer2DModel

    import diffusers_sweep

    config = next(reduced for name, _, reduced, _ in diffusers_sweep.MODELS if name.startswith("DiT"))
    model = DiTTransformer2DModel(**config)

    def loss(model, device):
        c = model.config
        latents = torch.randn(BATCH, c.in_channels, c.sample_size, c.sample_size, device=device)
        steps = torch.randint(0, 1000, (BATCH,), device=device)
        labels = torch.randint(0, c.num_embeds_ada_norm, (BATCH,), device=device)
        out = model(latents, timestep=steps, class_labels=labels).sample
        return F.mse_loss(out, torch.randn_like(out))
    return model, loss


def transformers_model(config_class, model_class, **config):
    def build():
        import transformers

        cfg = getattr(transformers, config_class)(vocab_size=1000, **config)

        def loss(model, device):
            ids = torch.randint(0, cfg.vocab_size, (BATCH, 128), device=device)
            return model(input_ids=ids, labels=ids).loss
        return getattr(transformers, model_class)(cfg), loss
    return build


def _hf_tasks():
    """metamem's _hf_tasks (the heads and batches metamem.hf trains), loaded
    by its path: the real run's child imports no metamem."""
    import importlib.util

    folder = importlib.util.find_spec("metamem").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("metamem_hf_tasks", os.path.join(folder, "_hf_tasks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transformers_architecture(model_type, seq=64):
    """hf_sweep's `model_type` at its reduced size (2 layers, width 64),
    with the head and the synthetic batch metamem.hf trains it on."""
    def build():
        import transformers
        from hf_configs import reduced

        tasks, cfg = _hf_tasks(), reduced(model_type)
        task, architecture = tasks.task_of(cfg)

        def loss(model, device):
            return model(**tasks.inputs(cfg, task, BATCH, seq, device, torch.float32)).loss
        return getattr(transformers, architecture)._from_config(cfg), loss
    return build


MODELS = {
    **{name: build for name, (build, _) in compiled_models.MODELS.items()
       if name != "torchtitan Llama 3 debugmodel"},  # its FlexAttention needs the compiler
    "transformers BERT masked LM (base width)": transformers_model(
        "BertConfig", "BertForMaskedLM", hidden_size=768, intermediate_size=3072, num_hidden_layers=2,
        num_attention_heads=12),
    "transformers OPT": transformers_model("OPTConfig", "OPTForCausalLM", hidden_size=256, ffn_dim=1024,
                                           num_hidden_layers=2, num_attention_heads=4, word_embed_proj_dim=256),
    "mixer with a custom autograd.Function": mixer,
    "diffusers DiTTransformer2DModel (diffusers_sweep's reduced size)": diffusers_dit,
    **{f"transformers {model_type} (hf_sweep's reduced size)": transformers_architecture(model_type)
       for model_type in hf_configs.ARCHITECTURES},
    **{f"timm {name}": timm_classifier(name) for name in timm_models.MODELS},
    **{f"torchvision {name}": torchvision_model(name)
       for name in torchvision_sweep.CLASSIFICATION + torchvision_sweep.SEGMENTATION},
}
GPUS = ("H100-80GB", "A100-80GB", "T4")
PRECISIONS = ("f32", "bf16 autocast")


def two_steps(name, precision, cudnn=False):
    """(model, run): the model built on the CPU, as users load one (a trace
    takes it with modules=[model]: on its one fake device a model built
    inside would stand on the GPU from its construction), and a function
    that moves it to cuda and runs two AdamW steps, returning each step's
    [max allocated, max reserved]; cuDNN and its attention off, or on as
    torch has them."""
    torch.manual_seed(0)
    model, loss_of = MODELS[name]()

    def run():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        torch.manual_seed(0)
        with torch.backends.cudnn.flags(enabled=cudnn):  # an RNN flattens its weights for cuDNN as it moves
            model.to("cuda").train()
        optimizer = torch.optim.AdamW(model.parameters())
        peaks = []
        for _ in range(2):
            torch.cuda.reset_peak_memory_stats()
            backends = contextlib.nullcontext() if cudnn else sdpa_kernel(
                [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
            with backends, torch.backends.cudnn.flags(enabled=cudnn):
                with torch.autocast("cuda", torch.bfloat16, enabled=precision != "f32"):
                    loss = loss_of(model, "cuda")
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
        return peaks
    return model, run


# The steps in a child on the fake GPU (real_torch_on_fake_gpu.PROLOGUE
# first), printing their peaks (measure() then leaves at once, as torch can
# abort as the process exits: real_torch_on_fake_gpu.LEAVE).
CHILD = f"""
sys.path.insert(0, {HERE!r})
from fake_gpu_sweep import two_steps
print(json.dumps(two_steps(*json.loads(sys.argv[3]))[1]()), flush=True)
"""


def run_one(name, gpu, precision, oracle, cudnn=False, recorded=True):
    """{"traced": peaks or error, "real": peaks or error, "seconds": [trace, real]}."""
    import metamem
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure
    from sweep_failure import why

    row, seconds = {}, []
    for side in ("traced", "real"):
        start = time.perf_counter()
        try:
            if side == "traced":
                model, run = two_steps(name, precision, cudnn)
                recordings = oracle if cudnn and recorded else ""
                with metamem.trace(device="cuda", gpu=gpu, modules=[model], fake_gpu=recordings):
                    row[side] = run()
            else:
                row[side] = measure(oracle, native.gpu(gpu), PROLOGUE + CHILD, json.dumps([name, precision, cudnn]))
        except Exception as error:  # a sweep reports every run
            row[side] = why(error)
        seconds.append(round(time.perf_counter() - start, 1))
    row["seconds"] = seconds
    return row


def verdict(row):
    traced, real = row["traced"], row["real"]
    if isinstance(real, str) or isinstance(traced, str):
        return "fails: " + (real if isinstance(real, str) else "(real) ") + \
            ("; trace: " + traced if isinstance(traced, str) else "")
    if traced == real:
        return "exact"
    return "; ".join(f"step {i + 1}: {t[0] - r[0]:+,} / {t[1] - r[1]:+,} B"
                     for i, (t, r) in enumerate(zip(traced, real)) if t != r)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="model names, comma-separated")
    parser.add_argument("--gpus", default=",".join(GPUS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--cudnn", action="store_true", help="cuDNN and cuDNN attention on, as torch has them")
    parser.add_argument("--own-convolutions", action="store_true",
                        help="with --cudnn, trace convolutions on metamem's models of torch's own kernels")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every run is exact")
    args = parser.parse_args()
    names, gpus, precisions = args.models.split(","), args.gpus.split(","), args.precisions.split(",")
    for given, known, what in ((names, MODELS, "model"), (gpus, GPUS, "GPU"), (precisions, PRECISIONS, "precision")):
        if set(given) - set(known):
            parser.error(f"no {what} {', '.join(sorted(set(given) - set(known)))}; the {what}s: {', '.join(known)}")
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        parser.error(f"METAMEM_ORACLE={oracle!r} holds no fake GPU to run real torch on (build/oracle)")
    rows, start = [], time.perf_counter()
    for name in names:
        for gpu in gpus:
            for precision in precisions:
                peaks = run_one(name, gpu, precision, oracle, args.cudnn, not args.own_convolutions)
                row = {"model": name, "gpu": gpu, "precision": precision, **peaks}
                row["verdict"] = verdict(row)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr if args.markdown else sys.stdout, flush=True)
    exact = sum(row["verdict"] == "exact" for row in rows)
    ran = sum(not row["verdict"].startswith("fails") for row in rows)
    if args.markdown:
        print("| model | GPU | precision | MiB allocated / reserved per step | trace / real on the fake GPU |")
        print("| --- | --- | --- | --- | --- |")
        for row in rows:
            peaks = row["real"] if not isinstance(row["real"], str) else row["traced"]
            cells = "; ".join(f"{a / 2**20:.2f} / {r / 2**20:.0f}" for a, r in peaks) \
                if not isinstance(peaks, str) else "-"
            print(f"| {row['model']} | {row['gpu']} | {row['precision']} | {cells} | {row['verdict']} |")
    print(f"{len(rows)} runs in {time.perf_counter() - start:.0f} s: {ran} ran on both sides, {exact} exact")
    return 1 if args.check and exact != len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
