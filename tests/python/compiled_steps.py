"""The compiled training steps of test_compile.py (traced on a fake cpu)
and test_compile_cuda.py (traced on fake cuda), each checked against the
same step run for real: a two-block causal LM compiled every way users
compile it, two AdamW steps. It imports only torch: real torch on the fake
GPU runs it in a process without metamem."""

import contextlib

import torch

from transformer_block import Block

VOCAB, WIDTH, BATCH, SEQ = 256, 64, 2, 32


class LM(torch.nn.Module):
    def __init__(self, graph_break=False):
        super().__init__()
        self.embedding = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList(Block(WIDTH, 4) for _ in range(2))
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        self.graph_break = graph_break

    def forward(self, ids):
        x = self.embedding(ids)
        for block in self.blocks:
            x = block(x)
        if self.graph_break:  # eager code between two compiled graphs
            torch._dynamo.graph_break()
        return self.head(x)


def compiled(model, how):
    """The model as the step calls it, and the loss function, compiled `how`."""
    loss = torch.nn.functional.cross_entropy
    if how == "torch.compile(model)":
        return torch.compile(model), loss
    if how == "model.compile()":
        model.compile()
        return model, loss
    if how == "each block":
        for block in model.blocks:
            block.compile()
        return model, loss
    if how == "the loss":
        return model, torch.compile(loss)
    if how == "fullgraph":
        return torch.compile(model, fullgraph=True), loss
    if how == "graph break":
        model.graph_break = True
        return torch.compile(model), loss
    if how.startswith("mode="):  # "mode=reduce-overhead", ...: measured on a real GPU (real_gpu.py)
        return torch.compile(model, mode=how.removeprefix("mode=")), loss
    if how == "each block, mode=reduce-overhead":  # a CUDA graph tree of four graphs a step
        for block in model.blocks:
            block.compile(mode="reduce-overhead")
        return model, loss
    assert how == "eager"
    return model, loss


def two_adamw_steps(how, batches=(BATCH, BATCH), compile_step=False, device="cpu", bf16=False, seq=SEQ,
                    evaluate_at=()):
    """The whole run: the model built, compiled and stepped; the same for
    the trace and the real run. On cuda, run() returns each step's max
    allocated and max reserved. There attention takes the math kernel in
    f32 (the fake GPU cannot run the memory-efficient one,
    docs/attention.md) and flash attention under bf16 autocast. The steps
    numbered in `evaluate_at` evaluate their batch instead, in eval mode
    under torch.no_grad()."""
    def run():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        torch.manual_seed(0)
        model = LM().to(device)
        optimizer = torch.optim.AdamW(model.parameters())
        forward, loss_fn = compiled(model, how)
        optimizer_step = torch.compile(optimizer.step) if compile_step else optimizer.step
        peaks = []
        for step, batch in enumerate(batches):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            ids = torch.randint(0, VOCAB, (batch, seq), device=device)
            kernel = SDPBackend.FLASH_ATTENTION if bf16 else SDPBackend.MATH
            evaluating = step in evaluate_at
            model.train(not evaluating)
            with (torch.autocast(device, torch.bfloat16, enabled=bf16),
                  sdpa_kernel(kernel) if device == "cuda" else contextlib.nullcontext(),
                  torch.no_grad() if evaluating else contextlib.nullcontext()):
                loss = loss_fn(forward(ids).flatten(0, 1), ids.flatten())
            if not evaluating:
                loss.backward()
                optimizer_step()
                optimizer.zero_grad()
            if device == "cuda":
                peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
        return peaks or None
    return run


def misaligned_head(device="cuda"):
    """A compiled vocabulary head of 1,001 outputs over 8,192 tokens: its
    products' shapes are misaligned, and Inductor benchmarks each against a
    padded one while it compiles. Returns max allocated and max reserved."""
    def run():
        torch.manual_seed(0)
        head = torch.nn.Linear(64, 1001).to(device)
        x = torch.randn(8192, 64, device=device, requires_grad=True)
        torch.compile(head)(x).sum().backward()
        return [[torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]]
    return run


def max_autotuned_layer(device="cuda"):
    """A linear layer and GELU over 8,192 tokens, compiled with max-autotune
    as torchtitan compiles FlexAttention (no CUDA graphs, coordinate
    descent on): each product's choices are benchmarked while compiling, on
    GPU tensors Inductor makes, a template's fused epilogue is weighed
    against its parts, and pointwise kernels are tuned at their first call.
    Returns max allocated and max reserved."""
    def run():
        torch.manual_seed(0)
        layer = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU()).to(device)
        x = torch.randn(8192, 64, device=device, requires_grad=True)
        options = {"max_autotune": True, "coordinate_descent_tuning": True, "triton.cudagraphs": False}
        torch.compile(layer, options=options)(x).sum().backward()
        return [[torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]]
    return run


def float8_mlp(recipe, compile, device="cuda"):
    """An MLP over 8,192 tokens trained in float8 by torchao
    (convert_to_float8_training, `recipe` "tensorwise" or "rowwise"), eager
    or compiled, under bf16 autocast, two AdamW steps. Returns each step's
    max allocated and max reserved."""
    def run():
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
        model = model.to(device)
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe))
        forward = torch.compile(model) if compile else model
        optimizer = torch.optim.AdamW(model.parameters())
        peaks = []
        for _ in range(2):
            torch.cuda.reset_peak_memory_stats()
            x = torch.randn(8192, 256, device=device)
            with torch.autocast(device, torch.bfloat16):
                loss = forward(x).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
        return peaks
    return run
