"""OpInfo conformance, fast subset: the ops a training step is made of must
trace exactly (outputs and input gradients laid out alike, the same peak
bytes as the real CPU run); the rest of op_db runs in opinfo_sweep.py."""

import pytest

import opinfo_sweep as sweep

TRAINING_OPS = [
    "add", "sub", "mul", "div.no_rounding_mode", "neg", "pow", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "where",
    "clamp", "sum", "mean", "var", "amax", "max.reduction_with_dim", "argmax", "cumsum",
    "mm", "bmm", "addmm", "matmul", "baddbmm", "einsum", "transpose", "permute", "reshape", "view",
    "expand", "cat", "stack", "split", "chunk", "index_select", "gather", "scatter_add", "sort", "topk",
    "softmax", "log_softmax", "nn.functional.layer_norm", "nn.functional.linear", "nn.functional.conv2d",
    "nn.functional.conv1d", "nn.functional.batch_norm", "nn.functional.group_norm", "nn.functional.gelu",
    "nn.functional.relu", "nn.functional.silu", "nn.functional.dropout", "nn.functional.embedding",
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.mse_loss",
    "nn.functional.avg_pool2d", "nn.functional.max_pool2d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.interpolate.bilinear", "nn.functional.pad.constant", "nn.functional.conv_transpose2d",
    "linalg.vector_norm", "nn.functional.normalize", "tril", "triu", "roll", "flip", "repeat",
    "nn.functional.scaled_dot_product_attention", "_chunk_cat",
]

# Spectral layers (FNO, FNet, long convolutions): MKL's copies of inputs it
# cannot view, its output layouts.
SPECTRAL_OPS = ["fft.fft", "fft.ifft", "fft.rfft", "fft.irfft", "fft.fft2", "fft.rfft2", "fft.irfftn", "fft.ihfft"]

OPS = {sweep.full_name(op): op for op in sweep.OPS}


def test_the_subset_names_real_ops():
    assert not [name for name in TRAINING_OPS + SPECTRAL_OPS if name not in OPS]


@pytest.mark.parametrize("name", TRAINING_OPS + SPECTRAL_OPS)
def test_op_traces_exactly(name):
    outcome = sweep.check_op(OPS[name], max_samples=8)
    assert outcome.kind == sweep.MATCH, f"{outcome.kind}: {outcome.detail}"


def test_an_op_that_reads_values_fails_with_its_name():
    outcome = sweep.check_op(OPS["nonzero"], max_samples=2)
    assert outcome.kind == sweep.UNSUPPORTED and outcome.detail == "aten::nonzero"
    # A kernel that reads the data of a tensor of indices.
    outcome = sweep.check_op(OPS["tensor_split"])
    assert outcome.kind == sweep.UNSUPPORTED and outcome.detail == "data" and "data" in sweep.VALUE_READS
