"""timm models, built from timm's registry (no weights): a training step of
each (batch 2, its own input size, cross entropy over its classes, two AdamW
steps) traced on a fake cpu against the real CPU run, and on fake cuda for
an H100 with the trace's time.

    PYTHONPATH=build/python .venv/bin/python tests/python/timm_sweep.py [resnet10t,...]
        [--markdown] [--check] [--pick]

The models are the two smallest (by parameter count, at most 60M) of each
of timm's model modules; --pick lists them again from the installed timm
(about a minute and a half). --check exits 1 unless every model listed is
exact on CPU and traces on fake cuda.
"""
import argparse
import sys
import time

import timm
import torch

import metamem
import metamem.timm
from sweep_failure import why

MODELS = [
    "halonet_h1", "eca_botnext26ts_256", "test_byobnet", "mobileone_s1", "cait_xxs24_224", "cait_xxs24_384",
    "coat_tiny", "coat_lite_tiny", "convit_tiny", "convit_small", "convmixer_768_32",
    "convmixer_1024_20_ks9_p14", "test_convnext", "test_convnext3", "cpubone_nano", "cpubone_t0",
    "crossvit_tiny_240", "crossvit_9_240", "csatv2", "csatv2_21m", "cs3darknet_focus_s", "cs3darknet_s",
    "cspnext_tiny", "cspnext_s", "davit_tiny", "davit_small", "deit_tiny_patch16_224",
    "deit_tiny_distilled_patch16_224", "densenet121", "densenetblur121d", "dla46x_c", "dla46_c", "dpn48b",
    "dpn68", "edgenext_xx_small", "edgenext_x_small", "efficientformer_l1", "efficientformer_l3",
    "efficientformerv2_s0", "efficientformerv2_s1", "test_efficientnet", "test_efficientnet_gn",
    "efficientvim_m1", "efficientvim_m1_dist", "efficientvit_b0", "efficientvit_b1", "efficientvit_m0",
    "efficientvit_m1", "vit_tiny_patch16_dinov3_qkvb", "eva02_tiny_patch14_224", "fasternet_t0", "fasternet_t1",
    "fastvit_t8", "fastvit_t12", "focalnet_tiny_srf", "focalnet_tiny_lrf", "gcvit_xxtiny", "gcvit_xtiny",
    "ghostnet_050", "ghostnetv3_050", "hardcorenas_b", "hardcorenas_a", "hgnetv2_b0", "hgnetv2_b1",
    "hiera_tiny_224", "hiera_small_abswin_256", "sam2_hiera_tiny", "sam2_hiera_small", "hrnet_w18_small",
    "hrnet_w18_small_v2", "iformer_t", "iformer_s", "inception_next_atto", "inception_next_tiny",
    "inception_resnet_v2", "inception_v3", "inception_v4", "lcnetv2_small", "lcnetv2_base", "levit_128s",
    "levit_conv_128s", "lowformer_b0", "lowformer_b1", "test_mambaout", "mambaout_femto", "test_coatnet",
    "test_maxvit", "poolformerv2_s12", "poolformer_s12", "gmlp_ti16_224", "gmixer_12_224",
    "mobilenetv3_small_050", "lcnet_035", "mobilevit_xxs", "mobilevitv2_050", "mvitv2_tiny", "mvitv2_small",
    "nest_tiny", "nest_tiny_jx", "nextvit_small", "nextvit_base", "test_nfnet", "nf_regnet_b0", "pit_ti_224",
    "pit_ti_distilled_224", "pvt_v2_b0", "pvt_v2_b1", "rdnet_tiny", "rdnet_small", "regnetx_002", "regnety_002",
    "repghostnet_050", "repghostnet_058", "repvit_m1", "repvit_m0_9", "res2next50", "res2net50_14w_8s",
    "resnest14d", "resnest26d", "test_resnet", "resnet10t", "resnetv2_18", "resnetv2_18d", "rexnet_100",
    "rexnetr_100", "selecsls42", "selecsls60", "legacy_seresnet18", "legacy_seresnext26_32x4d", "sequencer2d_s",
    "sequencer2d_m", "shvit_s1", "shvit_s2", "skresnet18", "skresnet34", "starnet_s050", "starnet_s100",
    "swiftformer_xs", "swiftformer_s", "swin_tiny_patch4_window7_224", "swin_s3_tiny_224",
    "swinv2_tiny_window16_256", "swinv2_tiny_window8_256", "swinv2_cr_tiny_224", "swinv2_cr_tiny_384",
    "tiny_vit_5m_224", "tiny_vit_11m_224", "tnt_s_legacy_patch16_224", "tnt_s_patch16_224", "tresnet_m",
    "tresnet_v2_l", "twins_svt_small", "twins_pcpvt_small", "visformer_tiny", "visformer_small", "test_vit",
    "test_vit2", "vit_tiny_r_s16_p8_224", "vit_tiny_r_s16_p8_384", "test_vit_relpos",
    "vit_srelpos_small_patch16_224", "vitamin_small_224", "volo_d1_224", "volo_d1_384", "ese_vovnet19b_slim_dw",
    "ese_vovnet19b_slim", "legacy_xception", "xception41p", "xception41", "xcit_nano_12_p8_224",
    "xcit_nano_12_p8_384"
]
BATCH = 2


def pick(per_module=2, max_params=60e6):
    picked = []
    for module in timm.list_modules():
        sizes = []
        for name in timm.list_models(module=module):
            try:
                with torch.device("meta"):  # parameters without memory or initialisation
                    model = timm.create_model(name)
            except Exception:  # a model timm cannot build without its weights' config
                continue
            sizes.append((sum(p.numel() for p in model.parameters()), name))
        picked += [name for params, name in sorted(sizes)[:per_module] if params <= max_params]
    return picked


def sweep_one(name):
    torch.manual_seed(0)
    model = timm.create_model(name)
    step = metamem.timm.training_step(model, BATCH, "cpu")
    try:
        with metamem.trace(device="cpu", modules=[model]) as t:
            step()
        traced, achieved = max(t.step_peaks), metamem.achieved_cpu(step, modules=[model])
        cpu = "exact" if traced == achieved else f"{traced - achieved:+,} B"
    except Exception as error:  # a sweep reports every model
        achieved, cpu = None, why(error)
    try:
        start = time.perf_counter()
        with metamem.trace(device="cuda", modules=[model]) as t:
            metamem.timm.training_step(model, BATCH, "cuda")()
        cuda = f"{t.peak_bytes / 2**20:,.0f} MiB, {(time.perf_counter() - start) * 1e3:.0f} ms"
    except Exception as error:
        cuda = why(error)
    params = sum(p.numel() for p in model.parameters())
    return params, model.pretrained_cfg["input_size"], achieved, cpu, cuda


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="?", default=",".join(MODELS), help="timm model names, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every model is exact and traces")
    parser.add_argument("--pick", action="store_true", help="print the models a sweep takes from this timm")
    args = parser.parse_args()
    if args.pick:
        print("\n".join(pick()))
        return
    rows, start = [], time.perf_counter()
    if args.markdown:
        print(f"| model | parameters | input | real CPU peak | metamem | fake cuda (H100): peak, trace time |")
        print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models.split(","):
        params, size, achieved, cpu, cuda = sweep_one(name)
        rows.append((name, cpu, cuda))
        shown = "-" if achieved is None else f"{achieved:,} B"
        if args.markdown:
            print(f"| {name} | {params / 1e6:.1f}M | {'x'.join(map(str, size))} | {shown} | {cpu} | {cuda} |", flush=True)
        else:
            print(f"{name:34} {params / 1e6:6.1f}M {shown:>16} {cpu:>10}  {cuda}", flush=True)
    exact = sum(cpu == "exact" for _, cpu, _ in rows)
    traced = sum("MiB" in cuda for _, _, cuda in rows)
    print(f"{len(rows)} models in {time.perf_counter() - start:.0f} s: {exact} exact on CPU, {traced} traced on fake cuda",
          file=sys.stderr)
    sys.exit(1 if args.check and (exact < len(rows) or traced < len(rows)) else 0)


if __name__ == "__main__":
    main()
