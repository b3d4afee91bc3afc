"""Hugging Face transformers architectures, built from their configs (no
weights, no network) and trained by metamem.hf.training_step: at a reduced
size, the traced peak of two AdamW steps on a fake cpu against the real CPU
run; at the config's own (published default) size, a trace on fake cuda for
an H100, with its time and peak.

    PYTHONPATH=build/python .venv/bin/python tests/python/hf_sweep.py [llama,t5,...]
        [--markdown] [--check] [--no-full]

--values placeholder reads zero where a step reads a traced value (see
metamem.trace). --check exits 1 unless every architecture listed is exact on CPU and traces
at full size.
"""
import argparse
import sys
import time

import torch

import metamem
import metamem.hf
from sweep_failure import why

# Every architecture swept, by transformers model type, with the head it
# trains (metamem.hf.task_of picks it).
ARCHITECTURES = [
    # decoders (causal LM), dense and mixture-of-experts
    "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "phi3", "falcon", "gpt_neox",
    "opt", "bloom", "gptj", "codegen", "olmo", "stablelm", "starcoder2", "granite", "mixtral", "qwen2_moe",
    # encoders (masked LM)
    "bert", "roberta", "distilbert", "albert", "electra", "deberta-v2", "xlm-roberta",
    # encoder-decoders
    "t5", "bart", "mbart", "pegasus", "marian", "whisper",
    # vision and vision-language
    "vit", "deit", "swin", "convnext", "clip", "siglip",
]

# A reduced size: each attribute a config has (by its name or transformers'
# alias of it) set, in its sub-configs (CLIP's text and vision) too.
REDUCED = {
    "num_hidden_layers": 2, "num_layers": 2, "num_decoder_layers": 2, "encoder_layers": 2, "decoder_layers": 2,
    "hidden_size": 64, "intermediate_size": 128, "n_inner": 128, "ffn_dim": 128, "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128, "d_ff": 128, "num_attention_heads": 4, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "d_kv": 16, "vocab_size": 256,
    "max_position_embeddings": 128, "max_target_positions": 128, "max_source_positions": 16,
    "num_local_experts": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64, "image_size": 32, "patch_size": 8, "embed_dim": 32,
    "depths": [1, 1], "num_heads": [2, 4], "window_size": 4, "hidden_sizes": [16, 32], "num_stages": 2,
    "embedding_size": 64, "projection_dim": 32, "projection_size": 64, "rotary_dim": 8, "decoder_vocab_size": 256,
}
# Token ids a config names, kept inside the reduced vocabulary.
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
             "cls_token_id", "forced_eos_token_id")
# What a published config sets and transformers' default config lacks.
# RoBERTa's positions start after its padding id (1): roberta-base and
# xlm-roberta-base publish 514 of them, for 512 tokens; transformers'
# default of 512 holds 510 (a longer sequence indexes past its table).
PUBLISHED = {"t5": {"decoder_start_token_id": 0}, "roberta": {"max_position_embeddings": 514},
             "xlm-roberta": {"max_position_embeddings": 514}}
# Where the reduced size above does not fit an architecture's own rules.
REDUCED_FOR = {
    "swin": {"patch_size": 4},
    "t5": {"num_heads": 4},
    "convnext": {"num_heads": None},
}
BATCH, SEQ, FULL_SEQ = 2, 16, 512


def published(model_type):
    cfg = metamem.hf.config(model_type)
    for key, value in PUBLISHED.get(model_type, {}).items():
        setattr(cfg, key, value)
    return cfg


def reduced(model_type):
    cfg = published(model_type)
    values = {**REDUCED, **REDUCED_FOR.get(model_type, {})}

    def settable(config, key, value):
        if value is None or not hasattr(config, key) or isinstance(getattr(config, key), dict):
            return False
        prop = getattr(type(config), key, None)
        if isinstance(prop, property) and prop.fset is None:  # derived (Falcon's head_dim)
            return False
        return isinstance(getattr(config, key), (list, tuple)) == isinstance(value, list)

    def shrink(config):
        for key, value in values.items():
            if settable(config, key, value):
                setattr(config, key, value)
        vocab = getattr(config, "vocab_size", None)
        for key in TOKEN_IDS:
            token = getattr(config, key, None)
            if isinstance(token, int) and vocab and token >= vocab:
                setattr(config, key, vocab - 1)
        for key in getattr(config, "sub_configs", {}):
            if getattr(config, key, None) is not None:
                shrink(getattr(config, key))
    shrink(cfg)
    return cfg


def exact_on_cpu(model_type, values):
    step = metamem.hf.training_step(reduced(model_type), batch=BATCH, seq=SEQ, device="cpu")
    with metamem.trace(device="cpu", values=values) as t:
        step()
    return max(t.step_peaks), metamem.achieved_cpu(step)


def traced_at_full_size(model_type, values):
    cfg = published(model_type)
    start = time.perf_counter()
    t = metamem.hf.trace_step(cfg, batch=1, seq=FULL_SEQ, device="cuda", steps=1, values=values)
    seconds = time.perf_counter() - start
    params = t.json()["model_states"]["param_bytes"] // 4
    return t.peak_bytes, seconds, params


def bytes_or_dash(value):
    return "-" if value is None else f"{value:,} B"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="?", default=",".join(ARCHITECTURES), help="model types, comma-separated")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every model is exact and traces")
    parser.add_argument("--no-full", action="store_true", help="skip the full-size fake-cuda traces")
    parser.add_argument("--values", choices=["error", "placeholder"], default="error",
                        help="what reading a traced value does (metamem.trace's values=)")
    args = parser.parse_args()
    rows, failures = [], 0
    start = time.perf_counter()
    for model_type in args.models.split(","):
        task, architecture = metamem.hf.task_of(published(model_type))
        try:
            traced, achieved = exact_on_cpu(model_type, args.values)
            cpu = "exact" if traced == achieved else f"{traced - achieved:+,} B"
        except Exception as error:  # a sweep reports every architecture
            traced = achieved = None
            cpu = why(error)
        full = "-"
        if not args.no_full:
            try:
                peak, seconds, params = traced_at_full_size(model_type, args.values)
                full = f"{params / 1e6:,.0f}M params, {peak / 2**30:.2f} GiB, {seconds * 1e3:.0f} ms"
            except Exception as error:
                full = why(error)
        ok = cpu == "exact" and (args.no_full or "GiB" in full)
        failures += not ok
        rows.append((model_type, architecture, achieved, cpu, full))
        if not args.markdown:
            print(f"{model_type:12} {architecture:40} {bytes_or_dash(achieved):>14} {cpu:>10}  {full}", flush=True)
    if args.markdown:
        print("| model type | trained as | real CPU peak (reduced size) | metamem | full size on fake cuda (H100, batch 1, "
              f"seq {FULL_SEQ}, one AdamW step) |")
        print("| --- | --- | --- | --- | --- |")
        for model_type, architecture, achieved, cpu, full in rows:
            print(f"| {model_type} | `{architecture}` | {bytes_or_dash(achieved)} | {cpu} | {full} |")
    exact = sum(row[3] == "exact" for row in rows)
    print(f"{len(rows)} architectures in {time.perf_counter() - start:.0f} s: {exact} exact on CPU", file=sys.stderr)
    sys.exit(1 if args.check and failures else 0)


if __name__ == "__main__":
    main()
