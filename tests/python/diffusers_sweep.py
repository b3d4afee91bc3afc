"""diffusers' denoisers built from their configs (no weights): Stable
Diffusion 1.5's UNet2DConditionModel (512 px: 64 x 64 latents, CLIP text
states of 77 x 768) and DiT-XL/2 (diffusers' default DiTTransformer2DModel,
256 px: 32 x 32 latents), each trained on the noise-prediction loss with
AdamW for two steps: at a reduced size traced on a fake cpu against the real
CPU run, at full size traced on fake cuda for an H100.

    PYTHONPATH=build/python .venv/bin/python tests/python/diffusers_sweep.py [--check]
"""
import argparse
import sys
import time

import torch
import torch.nn.functional as F
from diffusers import DiTTransformer2DModel, UNet2DConditionModel

import metamem


def unet_step(config, batch, device):
    def step():
        torch.manual_seed(0)
        with torch.device(device):
            unet = UNet2DConditionModel(**config)
        unet.train()
        opt = torch.optim.AdamW(unet.parameters())
        c = unet.config
        latents = torch.randn(batch, c.in_channels, c.sample_size, c.sample_size, device=device)
        text = torch.randn(batch, 77, c.cross_attention_dim, device=device)
        t = torch.randint(0, 1000, (batch,), device=device)
        for _ in range(2):
            noise = torch.randn_like(latents)
            F.mse_loss(unet(latents + noise, t, text).sample, noise).backward()
            opt.step()
            opt.zero_grad()
    return step


def dit_step(config, batch, device):
    def step():
        torch.manual_seed(0)
        with torch.device(device):
            dit = DiTTransformer2DModel(**config)
        dit.train()
        opt = torch.optim.AdamW(dit.parameters())
        c = dit.config
        latents = torch.randn(batch, c.in_channels, c.sample_size, c.sample_size, device=device)
        t = torch.randint(0, 1000, (batch,), device=device)
        labels = torch.randint(0, c.num_embeds_ada_norm, (batch,), device=device)
        for _ in range(2):
            out = dit(latents, timestep=t, class_labels=labels).sample
            F.mse_loss(out, torch.randn_like(out)).backward()
            opt.step()
            opt.zero_grad()
    return step


# (name, step, reduced config, full config)
MODELS = [
    ("UNet2DConditionModel (SD 1.5)", unet_step,
     dict(sample_size=16, block_out_channels=(32, 64), layers_per_block=1, cross_attention_dim=32,
          down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
          attention_head_dim=8, norm_num_groups=8),
     dict(sample_size=64, cross_attention_dim=768)),
    ("DiTTransformer2DModel (DiT-XL/2)", dit_step,
     dict(num_attention_heads=2, attention_head_dim=8, num_layers=2, sample_size=8),
     dict()),
]


def exact_on_cpu(make_step, config):
    step = make_step(config, 2, "cpu")
    with metamem.trace(device="cpu") as t:
        step()
    return max(t.step_peaks), metamem.achieved_cpu(step)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 unless every model is exact on CPU")
    args = parser.parse_args()
    print("| model | real CPU peak (reduced, batch 2) | metamem | full size on fake cuda (H100, batch 1): "
          "parameters, peak, trace time |")
    print("| --- | --- | --- | --- |")
    failures = 0
    for name, make_step, reduced, full in MODELS:
        traced, achieved = exact_on_cpu(make_step, reduced)
        failures += traced != achieved
        start = time.perf_counter()
        with metamem.trace(device="cuda") as t:
            make_step(full, 1, "cuda")()
        seconds = time.perf_counter() - start
        params = t.json()["model_states"]["param_bytes"] // 4
        cpu = "exact" if traced == achieved else f"{traced - achieved:+,} B"
        print(f"| {name} | {achieved:,} B | {cpu} | {params / 1e6:,.0f}M, {t.peak_bytes / 2**30:.2f} GiB, "
              f"{seconds * 1e3:.0f} ms (two steps) |")
    sys.exit(1 if args.check and failures else 0)


if __name__ == "__main__":
    main()
