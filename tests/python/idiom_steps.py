"""The idioms of ordinary training scripts on a GPU, two steps each, traced
on fake cuda as `metamem run` traces a script (host tensors on the host,
placeholder values, cuDNN's convolutions and RNNs from the fake GPU's
recordings) against the same steps run by the pinned torch on metamem's
fake GPU (real_torch_on_fake_gpu.py), cuDNN on as torch has it (issue 47):
max allocated and max reserved of each step. test_cuda_idioms.py runs each
on one of GPUS; this script on every GPU asked:

    METAMEM_ORACLE=build/oracle PYTHONPATH=build/python:tests/python .venv/bin/python \\
        tests/python/idiom_steps.py [--idioms "anomaly mode,Adagrad"] [--gpus H100-80GB,T4] [--markdown]

Each idiom builds its model on the host and moves it, as scripts do, and
returns each step's [torch.cuda.max_memory_allocated(),
torch.cuda.max_memory_reserved()], the peaks reset as the step begins.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as cp

HERE = os.path.dirname(os.path.abspath(__file__))
GPUS = ("H100-80GB", "A100-80GB", "T4")
STEPS = 2


def mlp(dropout=0.1):
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(1024, 256), torch.nn.LayerNorm(256), torch.nn.Linear(256, 10))


def conv_net():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 3, padding=1),
                               torch.nn.BatchNorm2d(64), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(64, 10))


def batch(size=128):
    """A batch as a dataset gives it: on the host."""
    return torch.randn(size, 256), torch.randint(0, 10, (size,))


def steps(step):
    """Each step's peaks: `step(i)` run STEPS times."""
    peaks = []
    for i in range(STEPS):
        torch.cuda.reset_peak_memory_stats()
        step(i)
        peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
    return peaks


def autograd_thread_let_go():
    """Return once autograd's CUDA thread has let go of the last graph it ran.

    torch.func.grad's graph (create_graph) is held, once grad returns, by
    that thread alone, until it next runs; on a busy host (CI's ctest -j2)
    real torch held it into the next step's forward, a trace never
    (docs/accuracy.md). A backward of an empty tensor runs on that thread
    after it lets go, and allocates nothing."""
    empty = torch.empty(0, device="cuda", requires_grad=True)
    torch.autograd.grad(empty.view(0), empty, torch.empty(0, device="cuda"))


def trained(model, optimizer, loss_of):
    """Steps of `optimizer` on the loss `loss_of(model, i)` gives."""
    def step(i):
        loss_of(model, i).backward()
        optimizer.step()
        optimizer.zero_grad()
    return steps(step)


def classified(model, x, y):
    return F.cross_entropy(model(x.cuda()), y.cuda())


def f16_autocast_grad_scaler():
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    scaler = torch.amp.GradScaler("cuda")

    def step(i):
        with torch.autocast("cuda", torch.float16):
            loss = classified(model, *batch())
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return steps(step)


def checkpointed(form):
    def run():
        model = mlp().cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def loss_of(model, i):
            x, y = batch()
            x = x.cuda().requires_grad_(form == "reentrant")  # reentrant checkpoints need an input with gradients
            if form == "sequential":
                out = cp.checkpoint_sequential(model, 2, x, use_reentrant=False)
            else:
                out = cp.checkpoint(model, x, use_reentrant=form == "reentrant")
            return F.cross_entropy(out, y.cuda())
        return trained(model, optimizer, loss_of)
    return run


def selective_checkpoint():
    # Products kept, everything else recomputed (torchtitan's selective AC).
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    keep = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]

    def policy(ctx, op, *args, **kwargs):
        return cp.CheckpointPolicy.MUST_SAVE if op in keep else cp.CheckpointPolicy.PREFER_RECOMPUTE

    def loss_of(model, i):
        x, y = batch()
        out = cp.checkpoint(model, x.cuda(), use_reentrant=False,
                            context_fn=lambda: cp.create_selective_checkpoint_contexts(policy))
        return F.cross_entropy(out, y.cuda())
    return trained(model, optimizer, loss_of)


def anomaly_mode():
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    with torch.autograd.detect_anomaly():
        return trained(model, optimizer, lambda model, i: classified(model, *batch()))


def gradient_accumulation():
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def step(i):
        for _ in range(4):
            (classified(model, *batch(32)) / 4).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return steps(step)


def pinned_loader_non_blocking():
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    data = torch.utils.data.TensorDataset(*batch(256))
    loader = iter(torch.utils.data.DataLoader(data, batch_size=128, pin_memory=True))

    def loss_of(model, i):
        x, y = next(loader)
        return F.cross_entropy(model(x.to("cuda", non_blocking=True)), y.to("cuda", non_blocking=True))
    return trained(model, optimizer, loss_of)


def side_stream_prefetch():
    # The next batch copied on a side stream while this one trains.
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    side = torch.cuda.Stream()

    def prefetched():
        x, y = batch()
        with torch.cuda.stream(side):
            return x.pin_memory().cuda(non_blocking=True), y.pin_memory().cuda(non_blocking=True)

    ahead = [prefetched()]

    def loss_of(model, i):
        torch.cuda.current_stream().wait_stream(side)
        x, y = ahead.pop()
        x.record_stream(torch.cuda.current_stream())
        y.record_stream(torch.cuda.current_stream())
        ahead.append(prefetched())
        return F.cross_entropy(model(x), y)
    return trained(model, optimizer, loss_of)


def channels_last_conv_net_bf16():
    model = conv_net().cuda().to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters())

    def loss_of(model, i):
        x = torch.randn(32, 3, 64, 64).cuda().to(memory_format=torch.channels_last)
        with torch.autocast("cuda", torch.bfloat16):
            return F.cross_entropy(model(x), torch.randint(0, 10, (32,)).cuda())
    return trained(model, optimizer, loss_of)


def ema_of_the_weights():
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.999))

    def step(i):
        classified(model, *batch()).backward()
        optimizer.step()
        optimizer.zero_grad()
        ema.update_parameters(model)
    return steps(step)


def validation_after_the_step():
    model = conv_net().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(i):
        model.train()
        F.cross_entropy(model(torch.randn(16, 3, 64, 64).cuda()), torch.randint(0, 10, (16,)).cuda()).backward()
        optimizer.step()
        optimizer.zero_grad()
        model.eval()
        with torch.inference_mode() if i else torch.no_grad():
            model(torch.randn(64, 3, 64, 64).cuda()).argmax(1)
    return steps(step)


def fused_adamw_with_a_schedule():
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=STEPS)

    def step(i):
        classified(model, *batch()).backward()
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
    return steps(step)


def stepped_by(make):
    def run():
        model = mlp().cuda()
        return trained(model, make(model.parameters()), lambda model, i: classified(model, *batch()))
    return run


def frozen_backbone():
    model = mlp().cuda()
    for parameter in model[:3].parameters():
        parameter.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    return trained(model, optimizer, lambda model, i: classified(model, *batch()))


def mixup_with_label_smoothing():
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def loss_of(model, i):
        x, y = batch()
        x, y = x.cuda(), F.one_hot(y.cuda(), 10).float()
        order = torch.randperm(x.shape[0], device="cuda")
        mixed = 0.7 * x + 0.3 * x[order]
        return F.cross_entropy(model(mixed), 0.7 * y + 0.3 * y[order], label_smoothing=0.1)
    return trained(model, optimizer, loss_of)


def two_losses_through_one_graph():
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def step(i):
        x, y = batch()
        out = model(x.cuda())
        F.cross_entropy(out, y.cuda()).backward(retain_graph=True)
        out.square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return steps(step)


def losses_logged_and_clipped_by_value():
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    logged = []

    def step(i):
        loss = classified(model, *batch())
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad()
        logged.append(loss.detach())
        if i == STEPS - 1:
            logged.append(torch.stack(logged).mean().item())
    return steps(step)


def pure_bf16_weights():
    model = mlp().cuda().to(torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters())
    return trained(model, optimizer, lambda model, i: classified(model, batch()[0].bfloat16(), batch()[1]))


def cudnn_benchmark_conv_net():
    torch.backends.cudnn.benchmark = True
    try:
        model = conv_net().cuda()
        optimizer = torch.optim.AdamW(model.parameters())
        return trained(model, optimizer, lambda model, i: F.cross_entropy(
            model(torch.randn(32, 3, 64, 64).cuda()), torch.randint(0, 10, (32,)).cuda()))
    finally:
        torch.backends.cudnn.benchmark = False


class Tagger(torch.nn.Module):
    """Tokens embedded (padding 0), an LSTM over the packed sequences, tags."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(1000, 128, padding_idx=0)
        self.lstm = torch.nn.LSTM(128, 256, num_layers=2, batch_first=True, bidirectional=True)
        self.tags = torch.nn.Linear(512, 20)

    def forward(self, tokens, lengths):
        packed = torch.nn.utils.rnn.pack_padded_sequence(self.embed(tokens), lengths, batch_first=True,
                                                         enforce_sorted=False)
        out, _ = self.lstm(packed)
        return self.tags(torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0])


def packed_lstm_tagger():
    model = Tagger().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    lengths = torch.tensor([48, 40, 33, 20, 17, 9, 5, 2] * 4)  # on the host, as pack_padded_sequence wants them

    def loss_of(model, i):
        tokens = torch.randint(1, 1000, (32, 48)).cuda()
        logits = model(tokens, lengths)
        return F.cross_entropy(logits.flatten(0, 1), torch.randint(0, 20, (32 * 48,)).cuda())
    return trained(model, optimizer, loss_of)


class TinyLM(torch.nn.Module):
    """Embedding tied to the head; causal attention by scaled_dot_product_attention."""

    def __init__(self, vocab=2048, width=256, heads=4):
        super().__init__()
        self.embed, self.heads = torch.nn.Embedding(vocab, width), heads
        self.qkv, self.out = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        q, k, v = self.qkv(self.norm(x)).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        x = x + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2))
        return self.head(x)


def tied_lm(precision):
    def run():
        model = TinyLM().cuda()
        optimizer = torch.optim.AdamW(model.parameters())

        def loss_of(model, i):
            tokens = torch.randint(0, 2048, (8, 257)).cuda()
            with torch.autocast("cuda", torch.bfloat16, enabled=precision == "bf16"):
                logits = model(tokens[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        return trained(model, optimizer, loss_of)
    return run


def multihead_attention_eval_fast_path():
    model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True),
                                        num_layers=2, enable_nested_tensor=False).cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def step(i):
        model.train()
        model(torch.randn(16, 64, 256).cuda()).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        model.eval()
        with torch.inference_mode():  # torch's fused encoder path
            model(torch.randn(16, 64, 256).cuda())
    return steps(step)


def weight_norm_layers():
    wn = torch.nn.utils.parametrizations.weight_norm
    model = torch.nn.Sequential(wn(torch.nn.Linear(256, 1024)), torch.nn.GELU(), wn(torch.nn.Linear(1024, 10))).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    return trained(model, optimizer, lambda model, i: classified(model, *batch()))


def gan_with_gradient_penalty():
    # WGAN-GP: a critic's gradient with respect to its input, kept in the
    # graph (create_graph) for its penalty; two optimizers; the generator's
    # output detached for the critic's step.
    generator = torch.nn.Sequential(torch.nn.Linear(64, 32 * 8 * 8), torch.nn.Unflatten(1, (32, 8, 8)),
                                    torch.nn.ConvTranspose2d(32, 16, 4, 2, 1), torch.nn.ReLU(),
                                    torch.nn.ConvTranspose2d(16, 3, 4, 2, 1), torch.nn.Tanh()).cuda()
    critic = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 4, 2, 1), torch.nn.LeakyReLU(0.2),
                                 torch.nn.Conv2d(16, 32, 4, 2, 1), torch.nn.LeakyReLU(0.2), torch.nn.Flatten(),
                                 torch.nn.Linear(32 * 8 * 8, 1)).cuda()
    g_opt = torch.optim.Adam(generator.parameters(), lr=1e-4, betas=(0.0, 0.9))
    c_opt = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))

    def step(i):
        real = torch.randn(32, 3, 32, 32).cuda()
        fake = generator(torch.randn(32, 64, device="cuda")).detach()
        mix = torch.rand(32, 1, 1, 1, device="cuda")
        between = (mix * real + (1 - mix) * fake).requires_grad_(True)
        grad, = torch.autograd.grad(critic(between).sum(), between, create_graph=True)
        penalty = ((grad.flatten(1).norm(dim=1) - 1) ** 2).mean()
        (critic(fake).mean() - critic(real).mean() + 10 * penalty).backward()
        c_opt.step()
        c_opt.zero_grad()
        (-critic(generator(torch.randn(32, 64, device="cuda"))).mean()).backward()
        g_opt.step()
        g_opt.zero_grad()
        critic.zero_grad()
    return steps(step)


def top_k_accuracy_logged():
    # As ImageNet scripts log it: top-1 and top-5 of each batch.
    model = mlp().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    logged = []

    def step(i):
        x, y = batch()
        out = model(x.cuda())
        y = y.cuda()
        F.cross_entropy(out, y).backward()
        optimizer.step()
        optimizer.zero_grad()
        correct = out.topk(5, 1).indices.eq(y[:, None])
        logged.append([correct[:, :k].any(1).float().mean().item() for k in (1, 5)])
    return steps(step)


class Vae(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encode = torch.nn.Sequential(torch.nn.Linear(784, 400), torch.nn.ReLU(), torch.nn.Linear(400, 40))
        self.decode = torch.nn.Sequential(torch.nn.Linear(20, 400), torch.nn.ReLU(), torch.nn.Linear(400, 784))

    def forward(self, x):
        mean, log_var = self.encode(x).chunk(2, dim=1)
        # Unchecked: the fake GPU computes no values for real torch's checks
        # to read (a trace finds them valid: test_cuda_idioms.py).
        posterior = torch.distributions.Normal(mean, (0.5 * log_var).exp(), validate_args=False)
        prior = torch.distributions.Normal(torch.zeros_like(mean), torch.ones_like(mean), validate_args=False)
        kl = torch.distributions.kl_divergence(posterior, prior).sum(1).mean()
        reconstruction = F.binary_cross_entropy_with_logits(self.decode(posterior.rsample()), x, reduction="none")
        return reconstruction.sum(1).mean() + kl


def vae_with_distributions():
    model = Vae().cuda()
    optimizer = torch.optim.Adam(model.parameters())
    return trained(model, optimizer, lambda model, i: model(torch.rand(128, 784).cuda()))


class TinyUNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.down = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.GroupNorm(8, 32),
                                        torch.nn.SiLU(), torch.nn.Dropout2d(0.1))
        self.middle = torch.nn.Sequential(torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.SiLU())
        self.up = torch.nn.ConvTranspose2d(64, 32, 2, stride=2)
        self.out = torch.nn.Conv2d(64, 3, 1)

    def forward(self, x):
        skip = self.down(x)
        up = self.up(self.middle(skip)) + F.interpolate(self.middle(skip), scale_factor=2, mode="bilinear")[:, :32]
        return self.out(torch.cat([skip, up], 1))


def unet_denoiser():
    model = TinyUNet().cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def loss_of(model, i):
        clean = torch.randn(16, 3, 64, 64).cuda()
        noise = torch.randn_like(clean)
        return F.mse_loss(model(clean + noise), noise)
    return trained(model, optimizer, loss_of)


def data_parallel_on_one_gpu():
    model = torch.nn.DataParallel(mlp()).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    return trained(model, optimizer, lambda model, i: classified(model, *batch()))


def attention_with_a_padding_mask():
    # nn.MultiheadAttention as scripts call it: need_weights left True, a
    # key padding mask from the batch's lengths.
    model = torch.nn.ModuleDict({"attention": torch.nn.MultiheadAttention(256, 4, batch_first=True),
                                 "head": torch.nn.Linear(256, 10)}).cuda()

    def loss_of(model, i):
        x = torch.randn(32, 64, 256).cuda()
        padding = (torch.arange(64)[None, :] >= torch.randint(16, 64, (32, 1))).cuda()
        out, weights = model["attention"](x, x, x, key_padding_mask=padding)
        return F.cross_entropy(model["head"](out.mean(1)), torch.randint(0, 10, (32,)).cuda())
    return trained(model, torch.optim.AdamW(model.parameters()), loss_of)


def ranking_metric_by_argsort():
    # A ranking loss's order and a metric's: argsort and cumsum on the GPU.
    model = mlp().cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    logged = []

    def step(i):
        x, y = batch(4096)
        scores = model(x.cuda())[:, 0]
        labels = (y.cuda() > 4).float()
        order = scores.argsort(descending=True)
        hits = labels[order].cumsum(0)
        F.binary_cross_entropy_with_logits(scores, labels).backward()
        optimizer.step()
        optimizer.zero_grad()
        logged.append((hits / torch.arange(1, 4097, device="cuda")).mean().item())
    return steps(step)


def spectral_norm_critic():
    sn = torch.nn.utils.parametrizations.spectral_norm
    critic = torch.nn.Sequential(sn(torch.nn.Conv2d(3, 32, 4, 2, 1)), torch.nn.LeakyReLU(0.2),
                                 sn(torch.nn.Conv2d(32, 64, 4, 2, 1)), torch.nn.LeakyReLU(0.2), torch.nn.Flatten(),
                                 sn(torch.nn.Linear(64 * 8 * 8, 1))).cuda()
    optimizer = torch.optim.Adam(critic.parameters(), lr=2e-4, betas=(0.5, 0.999))
    return trained(critic, optimizer, lambda model, i: F.softplus(-model(torch.randn(32, 3, 32, 32).cuda())).mean())


def embedding_bag_recommender():
    model = torch.nn.ModuleDict({"bags": torch.nn.EmbeddingBag(100000, 64, mode="sum"),
                                 "head": torch.nn.Linear(64, 1)}).cuda()

    def loss_of(model, i):
        ids = torch.randint(0, 100000, (2048,)).cuda()
        offsets = torch.arange(0, 2048, 8).cuda()
        scores = model["head"](model["bags"](ids, offsets))[:, 0]
        return F.binary_cross_entropy_with_logits(scores, torch.rand(256).cuda())
    return trained(model, torch.optim.Adagrad(model.parameters()), loss_of)


def spatial_transformer():
    # A localization net's affine grid, sampled by grid_sample.
    model = torch.nn.ModuleDict({
        "locate": torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 6)),
        "classify": torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                        torch.nn.Linear(16 * 30 * 30, 10))}).cuda()

    def loss_of(model, i):
        x = torch.randn(64, 3, 32, 32).cuda()
        grid = F.affine_grid(model["locate"](x).view(-1, 2, 3), list(x.shape), align_corners=False)
        warped = F.grid_sample(x, grid, align_corners=False)
        return F.cross_entropy(model["classify"](warped), torch.randint(0, 10, (64,)).cuda())
    return trained(model, torch.optim.AdamW(model.parameters()), loss_of)


def attention_with_dropout():
    # Attention dropout in training, as GPT-style models call it.
    model = TinyLM().cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def loss_of(model, i):
        tokens = torch.randint(0, 2048, (8, 257)).cuda()
        x = model.embed(tokens[:, :-1])
        q, k, v = model.qkv(model.norm(x)).unflatten(-1, (3, model.heads, -1)).permute(2, 0, 3, 1, 4)
        with torch.autocast("cuda", torch.bfloat16):
            attended = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=True)
        x = x + model.out(attended.transpose(1, 2).flatten(2).float())
        return F.cross_entropy(model.head(x).flatten(0, 1), tokens[:, 1:].flatten())
    return trained(model, optimizer, loss_of)


def lstm_with_projections(bias):
    def run():
        model = torch.nn.LSTM(128, 256, num_layers=2, proj_size=64, bias=bias, batch_first=True).cuda()
        optimizer = torch.optim.AdamW(model.parameters())
        return trained(model, optimizer, lambda model, i: model(torch.randn(16, 50, 128).cuda())[0].square().mean())
    return run


def video_conv3d():
    model = torch.nn.Sequential(torch.nn.Conv3d(3, 16, 3, padding=1), torch.nn.BatchNorm3d(16), torch.nn.ReLU(),
                                torch.nn.MaxPool3d(2), torch.nn.Conv3d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool3d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return trained(model, optimizer, lambda model, i: F.cross_entropy(
        model(torch.randn(4, 3, 8, 32, 32).cuda()), torch.randint(0, 10, (4,)).cuda()))


def text_cnn():
    embed = torch.nn.Embedding(20000, 128, padding_idx=0)
    convs = torch.nn.ModuleList(torch.nn.Conv1d(128, 64, k) for k in (3, 4, 5))
    model = torch.nn.ModuleDict({"embed": embed, "convs": convs, "head": torch.nn.Linear(192, 2)}).cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def loss_of(model, i):
        x = model["embed"](torch.randint(0, 20000, (64, 100)).cuda()).transpose(1, 2)
        pooled = torch.cat([F.adaptive_max_pool1d(F.relu(conv(x)), 1)[..., 0] for conv in model["convs"]], 1)
        return F.cross_entropy(model["head"](F.dropout(pooled, 0.5)), torch.randint(0, 2, (64,)).cuda())
    return trained(model, optimizer, loss_of)


def encoder_decoder_transformer():
    model = torch.nn.Transformer(d_model=128, nhead=4, num_encoder_layers=2, num_decoder_layers=2,
                                 dim_feedforward=256, batch_first=True).cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def loss_of(model, i):
        source, target = torch.randn(16, 40, 128).cuda(), torch.randn(16, 30, 128).cuda()
        mask = torch.nn.Transformer.generate_square_subsequent_mask(30, device="cuda")
        return model(source, target, tgt_mask=mask, tgt_is_causal=True).square().mean()
    return trained(model, optimizer, loss_of)


def magnitude_pruning():
    # torch.nn.utils.prune before each step, a layer at a time: it selects
    # the weights of least magnitude by topk (over 131,072 and 262,144 of
    # them), and the layer then trains through weight_orig * weight_mask.
    # (Pruning a layer again selects among the weights left by a boolean
    # mask, whose size is a value: torch's nonzero.)
    from torch.nn.utils import prune
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())

    def step(i):
        prune.l1_unstructured(model[2 * i], "weight", amount=0.1)
        classified(model, *batch()).backward()
        optimizer.step()
        optimizer.zero_grad()
    return steps(step)


def hard_pixel_mining():
    # Online hard example mining in segmentation: the loss of each pixel,
    # and the mean of the hardest quarter, chosen by topk (sorted by sort).
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 21, 1)).cuda()

    def loss_of(model, i):
        losses = F.cross_entropy(model(torch.randn(8, 3, 128, 128).cuda()),
                                 torch.randint(0, 21, (8, 128, 128)).cuda(), reduction="none")
        return losses.flatten().topk(losses.numel() // 4).values.mean()
    return trained(model, torch.optim.AdamW(model.parameters()), loss_of)


def clip_contrastive_loss():
    # CLIP: two towers, normalized embeddings, a learned temperature, and
    # cross entropy over the batch's similarities both ways.
    model = torch.nn.ModuleDict({"image": torch.nn.Sequential(torch.nn.Linear(512, 256), torch.nn.GELU(),
                                                              torch.nn.Linear(256, 128)),
                                 "text": torch.nn.Sequential(torch.nn.Embedding(5000, 128), torch.nn.Flatten(),
                                                             torch.nn.Linear(128 * 16, 128))}).cuda()
    scale = torch.nn.Parameter(torch.tensor(2.659).cuda())
    optimizer = torch.optim.AdamW([*model.parameters(), scale])

    def loss_of(model, i):
        images = F.normalize(model["image"](torch.randn(256, 512).cuda()), dim=-1)
        texts = F.normalize(model["text"](torch.randint(0, 5000, (256, 16)).cuda()), dim=-1)
        logits = scale.exp() * images @ texts.t()
        labels = torch.arange(256, device="cuda")
        return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
    return trained(model, optimizer, loss_of)


def distillation_from_a_frozen_teacher():
    teacher, student = mlp(0.0).cuda().eval(), torch.nn.Sequential(torch.nn.Linear(256, 10)).cuda()
    teacher.requires_grad_(False)
    optimizer = torch.optim.AdamW(student.parameters())

    def loss_of(model, i):
        x, y = batch()
        x = x.cuda()
        with torch.no_grad():
            soft = F.softmax(teacher(x) / 4.0, dim=-1)
        logits = model(x)
        kd = F.kl_div(F.log_softmax(logits / 4.0, dim=-1), soft, reduction="batchmean") * 16.0
        return kd + F.cross_entropy(logits, y.cuda())
    return trained(student, optimizer, loss_of)


def sharpness_aware_minimization():
    # SAM: a step to the worst nearby weights, a second gradient there, the
    # weights put back, then the optimizer's step.
    model = mlp().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(i):
        x, y = batch()
        classified(model, x, y).backward()
        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.norm(torch.stack([p.grad.norm(2) for p in params]), 2)
        moved = []
        with torch.no_grad():
            for p in params:
                e = p.grad * (0.05 / (norm + 1e-12))
                p.add_(e)
                moved.append(e)
        optimizer.zero_grad()
        classified(model, x, y).backward()
        with torch.no_grad():
            for p, e in zip(params, moved):
                p.sub_(e)
        optimizer.step()
        optimizer.zero_grad()
    return steps(step)


def per_sample_gradients_by_vmap():
    # torch.func: each sample's gradient by vmap over grad, clipped and
    # noised as DP-SGD does, then applied by hand.
    from torch.func import functional_call, grad, vmap
    model = torch.nn.Sequential(torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    def step(i):
        x, y = batch(64)
        grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, x.cuda(), y.cuda())
        autograd_thread_let_go()
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()]).norm(dim=0)
        factor = (1.0 / (norms + 1e-6)).clamp(max=1.0)
        for name, g in grads.items():
            clipped = (g * factor.view(-1, *[1] * (g.dim() - 1))).sum(0)
            params[name] = params[name] - 0.1 * (clipped + torch.randn_like(clipped)) / 64
    return steps(step)


def lora_adapters_on_a_frozen_base():
    class LoRALinear(torch.nn.Module):
        def __init__(self, base, rank=8):
            super().__init__()
            self.base = base.requires_grad_(False)
            self.a = torch.nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
            self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))

        def forward(self, x):
            return self.base(x) + F.dropout(x, 0.05) @ self.a.t() @ self.b.t() * 2.0

    model = torch.nn.Sequential(LoRALinear(torch.nn.Linear(256, 1024)), torch.nn.GELU(),
                                LoRALinear(torch.nn.Linear(1024, 10))).cuda()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    return trained(model, optimizer, lambda model, i: classified(model, *batch()))


def stochastic_depth_blocks():
    # Residual blocks dropped per sample (torchvision's stochastic_depth),
    # with LayerScale.
    from torchvision.ops import stochastic_depth

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp, self.gamma = mlp(0.0)[:4], torch.nn.Parameter(torch.full((256,), 1e-4))

        def forward(self, x):
            return x + stochastic_depth(self.gamma * self.mlp(x), 0.2, "row", self.training)

    model = torch.nn.Sequential(*[Block() for _ in range(4)], torch.nn.Linear(256, 10)).cuda()
    return trained(model, torch.optim.AdamW(model.parameters()), lambda model, i: classified(model, *batch()))


def gumbel_softmax_codebook():
    # A discrete bottleneck: straight-through Gumbel-softmax over a codebook.
    model = torch.nn.ModuleDict({"encode": torch.nn.Linear(256, 512), "codebook": torch.nn.Embedding(512, 64),
                                 "decode": torch.nn.Linear(64, 256)}).cuda()

    def loss_of(model, i):
        x = torch.randn(128, 256).cuda()
        codes = F.gumbel_softmax(model["encode"](x), tau=1.0, hard=True)
        return F.mse_loss(model["decode"](codes @ model["codebook"].weight), x)
    return trained(model, torch.optim.AdamW(model.parameters()), loss_of)


def triplet_loss_with_hardest_negatives():
    model = mlp().cuda()[:5]

    def loss_of(model, i):
        x, y = batch(256)
        emb = F.normalize(model(x.cuda()), dim=-1)
        y = y.cuda()
        distances = torch.cdist(emb, emb)
        same = y[:, None] == y[None, :]
        hardest_positive = (distances * same).max(1).values
        hardest_negative = distances.masked_fill(same, float("inf")).min(1).values
        return F.relu(hardest_positive - hardest_negative + 0.2).mean()
    return trained(model, torch.optim.AdamW(model.parameters()), loss_of)


def super_resolution_pixel_shuffle():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 5, padding=2, padding_mode="reflect"), torch.nn.Tanh(),
                                torch.nn.Conv2d(64, 32, 3, padding=1, padding_mode="circular"), torch.nn.Tanh(),
                                torch.nn.Conv2d(32, 3 * 9, 3, padding=1), torch.nn.PixelShuffle(3)).cuda()

    def loss_of(model, i):
        low = torch.randn(16, 3, 32, 32).cuda()
        return F.l1_loss(model(low), F.interpolate(low, scale_factor=3, mode="bicubic", align_corners=False))
    return trained(model, torch.optim.Adam(model.parameters()), loss_of)


def style_transfer_gram_matrices():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.InstanceNorm2d(32, affine=True),
                                torch.nn.ReLU(), torch.nn.Conv2d(32, 3, 3, padding=1)).cuda()
    features = torch.nn.Sequential(torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU()).cuda().requires_grad_(False)

    def gram(x):
        f = x.flatten(2)
        return torch.bmm(f, f.transpose(1, 2)) / f.shape[-1]

    def loss_of(model, i):
        content, style = torch.randn(4, 3, 64, 64).cuda(), torch.randn(4, 3, 64, 64).cuda()
        out = model(content)
        return F.mse_loss(features(out), features(content)) + F.mse_loss(gram(features(out)), gram(features(style)))
    return trained(model, torch.optim.Adam(model.parameters()), loss_of)


def grouped_query_attention_block():
    # SDPA with enable_gqa (4 query heads per key and value head), bf16
    # autocast, RMSNorm and SwiGLU as Llama-style blocks write them.
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.q, self.kv = torch.nn.RMSNorm(256), torch.nn.Linear(256, 256), torch.nn.Linear(256, 128)
            self.o, self.up, self.down = torch.nn.Linear(256, 256), torch.nn.Linear(256, 1024), torch.nn.Linear(512, 256)

        def forward(self, x):
            h = self.norm(x)
            q = self.q(h).unflatten(-1, (8, 32)).transpose(1, 2)
            k, v = self.kv(h).unflatten(-1, (2, 2, 32)).permute(2, 0, 3, 1, 4)
            x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                           .transpose(1, 2).flatten(2))
            gate, up = self.up(self.norm(x)).chunk(2, -1)
            return x + self.down(F.silu(gate) * up)

    model = torch.nn.Sequential(Block(), Block()).cuda()

    def loss_of(model, i):
        with torch.autocast("cuda", torch.bfloat16):
            return model(torch.randn(8, 128, 256).cuda()).float().square().mean()
    return trained(model, torch.optim.AdamW(model.parameters()), loss_of)


def r_drop_consistency():
    # R-Drop: two passes with dropout, cross entropy and their symmetric KL.
    model = mlp(0.3).cuda()

    def loss_of(model, i):
        x, y = batch()
        a, b = model(x.cuda()), model(x.cuda())
        kl = F.kl_div(a.log_softmax(-1), b.log_softmax(-1), log_target=True, reduction="batchmean") + \
            F.kl_div(b.log_softmax(-1), a.log_softmax(-1), log_target=True, reduction="batchmean")
        return F.cross_entropy(a, y.cuda()) + F.cross_entropy(b, y.cuda()) + kl
    return trained(model, torch.optim.AdamW(model.parameters()), loss_of)


def user_written_foreach_optimizer():
    # Lion written by hand with torch._foreach_* ops, as research code does.
    model = mlp().cuda()
    params = list(model.parameters())
    moments = [torch.zeros_like(p) for p in params]

    def step(i):
        classified(model, *batch()).backward()
        grads = [p.grad for p in params]
        with torch.no_grad():
            update = torch._foreach_lerp(moments, grads, 0.1)
            torch._foreach_sign_(update)
            torch._foreach_mul_(params, 1 - 1e-4 * 0.01)
            torch._foreach_add_(params, update, alpha=-1e-4)
            torch._foreach_lerp_(moments, grads, 0.01)
        model.zero_grad()
    return steps(step)


IDIOMS = {
    "f16 autocast + GradScaler + clipping": f16_autocast_grad_scaler,
    "checkpoint (reentrant)": checkpointed("reentrant"),
    "checkpoint (non-reentrant)": checkpointed("non_reentrant"),
    "checkpoint_sequential": checkpointed("sequential"),
    "selective checkpoint (products kept)": selective_checkpoint,
    "anomaly mode": anomaly_mode,
    "gradient accumulation + zeroed grads kept": gradient_accumulation,
    "pinned DataLoader + non-blocking copies": pinned_loader_non_blocking,
    "side-stream prefetch + record_stream": side_stream_prefetch,
    "channels-last conv net in bf16 autocast": channels_last_conv_net_bf16,
    "EMA of the weights (AveragedModel)": ema_of_the_weights,
    "validation after the step (no_grad or inference_mode)": validation_after_the_step,
    "fused AdamW + one-cycle schedule": fused_adamw_with_a_schedule,
    "SGD with Nesterov momentum (for-loop)": stepped_by(
        lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, foreach=False)),
    "Adam with AMSGrad": stepped_by(lambda ps: torch.optim.Adam(ps, amsgrad=True)),
    "RMSprop (centered)": stepped_by(lambda ps: torch.optim.RMSprop(ps, centered=True)),
    "Adagrad": stepped_by(torch.optim.Adagrad),
    "Adafactor": stepped_by(torch.optim.Adafactor),
    "NAdam (decoupled weight decay)": stepped_by(
        lambda ps: torch.optim.NAdam(ps, weight_decay=0.01, decoupled_weight_decay=True)),
    "RAdam": stepped_by(torch.optim.RAdam),
    "Adamax": stepped_by(torch.optim.Adamax),
    "ASGD": stepped_by(torch.optim.ASGD),
    "Rprop": stepped_by(torch.optim.Rprop),
    "fused SGD with momentum": stepped_by(lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True)),
    "fused Adagrad": stepped_by(lambda ps: torch.optim.Adagrad(ps, fused=True)),
    "fused Adam with a learning rate tensor": stepped_by(
        lambda ps: torch.optim.Adam(ps, lr=torch.tensor(1e-3), fused=True)),
    "frozen backbone": frozen_backbone,
    "mixup + label smoothing": mixup_with_label_smoothing,
    "two losses through one graph (retain_graph)": two_losses_through_one_graph,
    "losses logged + clip_grad_value_": losses_logged_and_clipped_by_value,
    "bf16 weights (no autocast)": pure_bf16_weights,
    "cudnn.benchmark conv net": cudnn_benchmark_conv_net,
    "packed sequences through a bidirectional LSTM": packed_lstm_tagger,
    "tied embedding + causal SDPA (f32)": tied_lm("f32"),
    "tied embedding + causal SDPA (bf16 autocast)": tied_lm("bf16"),
    "TransformerEncoder + its inference fast path": multihead_attention_eval_fast_path,
    "weight_norm parametrizations": weight_norm_layers,
    "GAN with a gradient penalty (create_graph)": gan_with_gradient_penalty,
    "top-1 and top-5 accuracy logged": top_k_accuracy_logged,
    "VAE with torch.distributions": vae_with_distributions,
    "U-Net denoiser (GroupNorm + ConvTranspose2d + bilinear upsampling)": unet_denoiser,
    "DataParallel on one GPU": data_parallel_on_one_gpu,
    "MultiheadAttention with a key padding mask": attention_with_a_padding_mask,
    "ranking metric by argsort and cumsum": ranking_metric_by_argsort,
    "spectral_norm critic": spectral_norm_critic,
    "EmbeddingBag recommender (Adagrad)": embedding_bag_recommender,
    "spatial transformer (affine_grid + grid_sample)": spatial_transformer,
    "attention dropout (SDPA in bf16 autocast)": attention_with_dropout,
    "LSTM with projections": lstm_with_projections(True),
    "LSTM with projections and no biases": lstm_with_projections(False),
    "video Conv3d": video_conv3d,
    "text CNN (Conv1d + max pooling)": text_cnn,
    "encoder-decoder Transformer with a causal mask": encoder_decoder_transformer,
    "magnitude pruning between steps": magnitude_pruning,
    "hard pixel mining (topk of per-pixel losses)": hard_pixel_mining,
    "CLIP contrastive loss with a learned temperature": clip_contrastive_loss,
    "distillation from a frozen teacher (KL divergence)": distillation_from_a_frozen_teacher,
    "sharpness-aware minimization (two backward passes)": sharpness_aware_minimization,
    "per-sample gradients by torch.func vmap (DP-SGD)": per_sample_gradients_by_vmap,
    "LoRA adapters on a frozen base": lora_adapters_on_a_frozen_base,
    "stochastic depth + LayerScale": stochastic_depth_blocks,
    "straight-through Gumbel-softmax codebook": gumbel_softmax_codebook,
    "triplet loss with hardest negatives (cdist)": triplet_loss_with_hardest_negatives,
    "super-resolution (reflect and circular padding + PixelShuffle + bicubic)": super_resolution_pixel_shuffle,
    "style transfer (InstanceNorm + Gram matrices)": style_transfer_gram_matrices,
    "grouped-query attention + RMSNorm + SwiGLU (bf16 autocast)": grouped_query_attention_block,
    "R-Drop (two dropout passes + symmetric KL)": r_drop_consistency,
    "Lion written with torch._foreach ops": user_written_foreach_optimizer,
}


def run(name):
    torch.manual_seed(0)
    return IDIOMS[name]()


# The idiom in a child on the fake GPU (real_torch_on_fake_gpu.PROLOGUE
# first), printing its peaks.
CHILD = f"""
sys.path.insert(0, {HERE!r})
import idiom_steps
print(json.dumps(idiom_steps.run(sys.argv[3])), flush=True)
"""


def traced(gpu, oracle):
    """A fake-cuda trace as `metamem run` makes one, cuDNN's convolutions
    and RNNs from the fake GPU `oracle`'s recordings."""
    import metamem

    return metamem.trace(device="cuda", gpu=gpu, values="placeholder", host_tensors="host", fake_gpu=oracle)


def compare(name, gpu, oracle):
    """{"traced": peaks, "real": peaks} of the idiom `name` on `gpu`."""
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure

    with traced(gpu, oracle):
        peaks = run(name)
    return {"traced": peaks, "real": measure(oracle, native.gpu(gpu), PROLOGUE + CHILD, name)}


def main():
    from fake_gpu_sweep import verdict
    from sweep_failure import why

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--idioms", default=",".join(IDIOMS), help="idiom names, comma-separated")
    parser.add_argument("--gpus", default=",".join(GPUS))
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args()
    names, gpus = args.idioms.split(","), args.gpus.split(",")
    for given, known, what in ((names, IDIOMS, "idiom"), (gpus, GPUS, "GPU")):
        if set(given) - set(known):
            parser.error(f"no {what} {', '.join(sorted(set(given) - set(known)))}; the {what}s: {', '.join(known)}")
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        parser.error(f"METAMEM_ORACLE={oracle!r} holds no fake GPU to run real torch on (build/oracle)")
    start, cells = time.perf_counter(), {}
    for name in names:
        for gpu in gpus:
            try:
                row = compare(name, gpu, oracle)
                cells[name, gpu] = verdict(row)
            except Exception as error:  # a sweep reports every run
                row, cells[name, gpu] = None, "fails: " + why(error)
            print(json.dumps({"idiom": name, "gpu": gpu, "row": row, "verdict": cells[name, gpu]}), flush=True)
    seconds = time.perf_counter() - start
    exact = sum(v == "exact" for v in cells.values())
    print(f"{exact} of {len(cells)} exact, {seconds:.0f} s", file=sys.stderr)
    if args.markdown:
        print("| idiom | " + " | ".join(gpus) + " |\n|---|" + "---|" * len(gpus))
        for name in names:
            print(f"| {name} | " + " | ".join(cells[name, gpu] for gpu in gpus) + " |")
    return 0 if exact == len(cells) else 1


if __name__ == "__main__":
    sys.exit(main())
