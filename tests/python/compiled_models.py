"""Ten models' training steps, eager or compiled (issue 46's table): the
test LM and the same with a graph break, transformers' Llama, Mistral,
GPT-2 and BERT, timm's ViT and ConvNeXt, diffusers' UNet and torchtitan's
Llama 3 debug model, with FlexAttention. Each is built on the CPU before its step (so that
initializers that read random values run for real) and the step moves it
to the device, compiles it as its users do and runs two AdamW steps. It
imports only torch and the models' libraries: real torch on the fake GPU
runs it in a process without metamem (compile_sweep.py)."""

import contextlib

import torch
import torch.nn.functional as F

# (batch, sequence) per device: small on the CPU, whose real run computes;
# on fake cuda, where neither side computes, large enough that
# activations rather than cuBLAS's workspaces make the peak.
SIZES = {"cpu": (2, 32), "cuda": (32, 256)}


def compiled_steps_lm(graph_break=False):
    from compiled_steps import LM, VOCAB

    def loss(model, device):
        ids = torch.randint(0, VOCAB, SIZES[device], device=device)
        return F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
    return LM(graph_break=graph_break), loss


def transformers_lm(config_class, model_class, **config):
    """A transformers model at a reduced size, trained on its own loss."""
    import transformers

    cfg = getattr(transformers, config_class)(vocab_size=256, **config)
    model = getattr(transformers, model_class)(cfg)

    def loss(model, device):
        ids = torch.randint(0, cfg.vocab_size, SIZES[device], device=device)
        return model(input_ids=ids, labels=ids).loss
    return model, loss


def timm_classifier(name):
    import timm

    size = {"img_size": 64} if name.startswith("vit") else {}  # a ConvNeXt takes any size
    model = timm.create_model(name, num_classes=10, **size)

    def loss(model, device):
        batch = SIZES[device][0]
        images = torch.randn(batch, 3, 64, 64, device=device)
        return F.cross_entropy(model(images), torch.randint(0, 10, (batch,), device=device))
    return model, loss


def unet():
    from diffusers import UNet2DConditionModel

    model = UNet2DConditionModel(sample_size=16, block_out_channels=(32, 64), layers_per_block=1,
                                 cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
                                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))

    def loss(model, device):
        batch = SIZES[device][0]
        latents = torch.randn(batch, 4, 16, 16, device=device)
        text = torch.randn(batch, 77, 32, device=device)
        steps = torch.randint(0, 1000, (batch,), device=device)
        noise = torch.randn_like(latents)
        return F.mse_loss(model(latents + noise, steps, text).sample, noise)
    return model, loss


def torchtitan_debug_model():
    from torchtitan.models.llama3 import model_registry

    config = model_registry("debugmodel").model  # FlexAttention, Llama 3's only attention since torchtitan 0.3
    model = config.build()
    with torch.no_grad():  # as torchtitan's trainer initializes
        model.init_weights(buffer_device=None)

    def loss(model, device):
        batch, seq = SIZES[device]
        tokens = torch.randint(0, config.vocab_size, (batch, seq + 1), device=device)
        # One document to a sequence, its block mask made as torchtitan's
        # trainer makes it, by a compiled create_block_mask.
        positions = torch.arange(seq, device=device).repeat(batch, 1)
        masks = model.get_attention_masks(positions=positions)
        logits = model(tokens[:, :-1], positions=positions, attention_masks=masks)
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    return model, loss


# name: (how the model is built, how its users compile it)
MODELS = {
    "test LM": (compiled_steps_lm, "torch.compile"),
    "test LM with a graph break": (lambda: compiled_steps_lm(graph_break=True), "torch.compile"),
    "Llama": (lambda: transformers_lm("LlamaConfig", "LlamaForCausalLM", hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2), "torch.compile"),
    "Mistral": (lambda: transformers_lm("MistralConfig", "MistralForCausalLM", hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
                "torch.compile"),
    "GPT-2": (lambda: transformers_lm("GPT2Config", "GPT2LMHeadModel", n_embd=64, n_layer=2, n_head=4,
                                      n_positions=256), "torch.compile"),
    "BERT": (lambda: transformers_lm("BertConfig", "BertForMaskedLM", hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4), "torch.compile"),
    "timm ViT-Ti/16 at 64 px": (lambda: timm_classifier("vit_tiny_patch16_224"), "torch.compile"),
    "timm ConvNeXt-Atto at 64 px": (lambda: timm_classifier("convnext_atto"), "torch.compile"),
    "diffusers UNet2DConditionModel": (unet, "torch.compile"),
    # torchtitan compiles each block, fullgraph (apply_compile), and its
    # FlexAttention with max-autotune even when the blocks are not.
    "torchtitan Llama 3 debugmodel": (torchtitan_debug_model, "each block"),
}
# name: why it cannot train on the CPU
NOT_ON_CPU = {"torchtitan Llama 3 debugmodel": "FlexAttention has no backward on the CPU (torch)"}


def compiled(model, how, mode=None):
    if how == "each block":
        blocks = model.layers
        for name, block in list(blocks.named_children()):
            blocks.register_module(name, torch.compile(block, fullgraph=True, mode=mode))
        return model
    return torch.compile(model, mode=mode)


def two_adamw_steps(name, device="cpu", compile=True, mode=None, steps=2, evaluate_at=()):
    """(model, run): the model built on the CPU, and a function that moves
    it to `device`, compiles it (unless `compile` is false; with torch.compile's
    `mode`) and runs `steps` AdamW steps, two by default (CUDA graph trees
    warm up, record, then replay: four show each); the steps numbered in
    `evaluate_at` compute the loss in eval mode under torch.no_grad()
    instead. On cuda run() returns each step's max allocated and max
    reserved; attention takes the kernel the GPU takes but cuDNN's, and
    convolutions torch's native kernels, cuDNN off (the fake GPU cannot run
    cuDNN, docs/cuda-paths.md)."""
    build, how = MODELS[name]
    torch.manual_seed(0)
    model, loss_of = build()

    def run():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        torch.manual_seed(0)
        model.to(device).train()
        forward = compiled(model, how, mode) if compile else model
        optimizer = torch.optim.AdamW(model.parameters())
        peaks = []
        for step in range(steps):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            evaluating = step in evaluate_at
            model.train(not evaluating)
            with (sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
                  if device == "cuda" else contextlib.nullcontext(),
                  torch.backends.cudnn.flags(enabled=False),
                  torch.no_grad() if evaluating else contextlib.nullcontext()):
                loss = loss_of(forward, device)
                if not evaluating:
                    loss.backward()
            if not evaluating:
                optimizer.step()
                optimizer.zero_grad()
            if device == "cuda":
                peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
        return peaks or None
    return model, run
