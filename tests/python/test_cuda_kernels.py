"""libtorch's own CUDA kernels that allocate inside, traced on fake cuda as
real torch holds them on the fake GPU (tests/python/real_torch_on_fake_gpu.py):
each allocation and free in the same order with the same requested bytes,
and so max allocated and max reserved to the byte. The cases are
real_gpu.py's, which a real GPU measures as well."""

import os

import pytest
import torch

import real_gpu
from ci_subset import one_gpu_each, one_in

ORACLE = os.environ.get("METAMEM_ORACLE", "")


def in_runs(events):
    """Allocations in order, and each run of frees between them as a sorted
    tuple: autograd frees a node's saved tensors in its own order."""
    runs, frees = [], []
    for kind, size, *_ in events:
        if kind == "free":
            frees.append(size)
            continue
        if frees:
            runs.append(("free", tuple(sorted(frees))))
            frees = []
        runs.append(("alloc", size))
    return runs + ([("free", tuple(sorted(frees)))] if frees else [])


def assert_as_real_torch(gpu, case, fake_gpu=None):
    """Traced (following the fake GPU `fake_gpu`'s recordings, if given) as
    real torch runs `case`, allocation by allocation; max allocated and
    reserved too. The real run and the trace."""
    if not os.path.exists(os.path.join(ORACLE, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={ORACLE!r} holds no fake GPU to run real torch on")
    import metamem._metamem as native
    real = real_gpu.on_fake_gpu(ORACLE, native.gpu(gpu), case)
    traced = real_gpu.traced(gpu, case, fake_gpu)
    assert "error" not in real and "error" not in traced, (real, traced)
    assert in_runs(traced["events"]) == in_runs(real["events"][0])
    assert (traced["allocated"], traced["reserved"]) == tuple(real["steps"][0])
    return real, traced


# Where torch 2.14.1 allocates otherwise than the H200's torch 2.11, which
# on the fake H200 equals the H200 there too (docs/accuracy.md): group
# norm's statistics, and the memory-efficient forward's seed and offset
# (two 8-byte tensors in 2.14.1, without dropout too).
OTHER_IN_TORCH_2_11 = {*real_gpu.GROUP_NORM_CASES, "memory-efficient attention with one head, f32"}


@pytest.mark.parametrize("case", one_in(4, [case for case in real_gpu.LIBTORCH_KERNEL_CASES
                                             if case not in OTHER_IN_TORCH_2_11 | real_gpu.NOT_RUN_ON_THE_H200]))
def test_the_fake_gpu_runs_libtorchs_kernels_as_a_real_h200_did(case):
    # What the kernels above are traced against is itself checked: the
    # H200's recorded allocations and frees (2026-11-30), one by one.
    if not os.path.exists(os.path.join(ORACLE, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={ORACLE!r} holds no fake GPU to run real torch on")
    import metamem._metamem as native
    fake = real_gpu.on_fake_gpu(ORACLE, native.gpu("H200"), case)
    assert "error" not in fake, fake["error"]
    recorded = real_gpu.h200_recording(case)
    assert fake["steps"] == recorded["steps"]
    assert fake["events"] == recorded["events"]  # allocation by allocation, on the one stream


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB", "T4"], list(real_gpu.SORT_CASES)))
def test_sorting_holds_cubs_temporaries_as_real_torch_from_the_fake_gpus_recordings(gpu, case):
    # Before (traced with torch's own kernels modelled, not recorded): the
    # sort of 262,144 floats held 4,194,304 B where real torch holds
    # 9,496,064 B (cub's 3,204,607 B of temporaries and an index buffer);
    # topk over them 1,363,456 B against 2,216,960 B (the radix
    # selection's counts, then the sort of what it selected).
    assert_as_real_torch(gpu, case, fake_gpu=ORACLE)


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB", "T4", "L4"], [
    case for case in real_gpu.SORT_CASES if case.startswith(("sort", "stable", "argsort", "topk", "kthvalue", "median",
                                                               "nanmedian", "randperm"))]))
def test_a_sort_topk_median_or_randperm_holds_what_real_torch_holds_without_the_fake_gpu(gpu, case):
    # libtorch's buffers (one slice's indices, the (index, slice) pairs, a
    # copy with the slice innermost) and cub's temporary storage, sized as
    # cub 3.0 sizes it for the GPU's architecture (meta/CudaSort.cpp);
    # topk's radix selection across blocks (per-block digit counts, as many
    # blocks as the GPU's SMs take), then the sort of what it selected; a
    # whole tensor's median, the sort of it flattened and the ops that
    # index it. Before: the outputs alone (the sort of 262,144 floats
    # 4,194,304 B against 9,496,064 B on the H100; topk of a tenth of them
    # 1,363,456 B against 2,216,960 B; their median 1,049,088 B against
    # 9,496,064 B; randperm of 100,000 800,256 B against 4,834,304 B, its
    # arange, random keys and their sort). Keys of 16 bits before sm90
    # take cub's older passes, their spine sized by the SMs (the sort of
    # 300,000 bf16 on the A100: 6,000,640 B traced before 2026-12-03,
    # 9,598,976 B real). The L4 (sm89) runs sm86's code: real torch's sorts
    # through cub stopped on its fake GPU before 2026-12-03.
    assert_as_real_torch(gpu, case, fake_gpu="")


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB", "T4"], [
    case for case in real_gpu.SORT_CASES if case.startswith(("embedding backward", "embedding_bag"))]))
def test_an_embeddings_gradient_past_3072_ids_holds_what_real_torch_holds_without_the_fake_gpu(gpu, case):
    # Sorted ids and their positions, runs of equal ids and their partial
    # segments (by the number of ids and of weights, not of distinct ones),
    # and the partial sums or, for a token-type embedding, the atomics'
    # float buffer; cub's temporary storage for the sort (meta/CudaSort.cpp),
    # the runs (unique_by_key), the partial segments' offsets (an exclusive
    # sum) and, scaled by frequency, the ids' counts (two scans by key), as
    # cub sizes each for the GPU's architecture. Before: none of them
    # (GPT-2's vocabulary over 16,384 ids: 236,251,648 B and 291,504,128 B
    # reserved where the trace held 232,783,872 B and 234,881,024 B); the
    # cub storage of the runs, offsets and counts until 2026-12-04 (a
    # kilobyte or two to 14 KB each, never at the peak here). An
    # EmbeddingBag's sum or mean sorts whatever the number of ids (4,096
    # summed: 2,634,752 B traced, 4,120,576 B real), and makes its bags'
    # sizes and ids' bags before its output.
    assert_as_real_torch(gpu, case, fake_gpu="")


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB", "T4"], [
    case for case in real_gpu.SORT_CASES if case.startswith(("gradient of", "index_put_", "_unsafe", "arange"))]))
def test_an_index_put_that_sorts_holds_what_real_torch_holds_without_the_fake_gpu(gpu, case):
    # Accumulating (the gradient of x[ids]) or deterministic: each index
    # range-checked (its minimum and maximum; none in autograd's gradient,
    # which skips the check), wrapped and scaled into the linear index, the
    # values broadcast and self transposed made contiguous, the sorted
    # indices and their positions, and cub's storage for the sort
    # (meta/CudaIndexing.cpp); under deterministic algorithms the arange's
    # fill (one element, as any resize_ that grows a storage). Before: self
    # and the outputs alone (200,000 ids into 100,000 floats 2,800,640 B
    # against 12,452,352 B on the H100; Swin's relative position table
    # 81,920 B against 167,936 B).
    assert_as_real_torch(gpu, case, fake_gpu="")


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB", "T4"], list(real_gpu.SCAN_CASES)))
def test_a_cumulative_sum_holds_what_real_torch_holds_without_the_fake_gpu(gpu, case):
    # The input cast to the result's dtype, contiguous copies of a strided
    # input and out=, and for one slice cub's scan storage, the same on
    # every architecture for libtorch's operators, or under deterministic
    # algorithms a sum per block, as many blocks as the GPU has SMs at most
    # (meta/CudaScan.cpp). Before: the outputs alone (a running count of
    # 50,000 bools 450,560 B against 852,992 B; a column's sum 600,576 B
    # against 801,792 B; 100,000 floats' 800,768 B against 802,304 B).
    assert_as_real_torch(gpu, case, fake_gpu="")


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB", "T4"], list(real_gpu.COMPOSED_KERNEL_CASES)))
def test_kernels_that_run_other_ops_inside_hold_them_as_real_torch(gpu, case):
    # count_nonzero's mask and the int64 copy its sum reads; scatter_reduce's
    # mean counting through ones; histc's aminmax; multinomial's checks, its
    # noise and topk's buffers or argmax's staging (its prefix sums with
    # replacement); cdist's products; Dirichlet's sums of its gammas
    # (meta/CudaReduction.cpp, CudaIndexing.cpp, CudaSort.cpp;
    # _euclidean_dist decomposed). Before:
    # the outputs alone (count_nonzero of 1,000,000 floats 4,000,768 B
    # against 13,002,752 B on the H100; multinomial of 8 with replacement
    # from 16 x 50,257 3,217,920 B against 12,868,608 B; cdist's forward
    # and backward 34,343,424 B against 67,897,856 B, its forward's cuBLAS
    # workspace missing; torch.distributions' samplers stopped a trace).
    assert_as_real_torch(gpu, case, fake_gpu="")


def test_an_index_by_a_boolean_mask_is_not_taken_from_the_fake_gpus_zeros():
    # index_put_ by a mask allocates by its count of trues, a value the fake
    # GPU does not compute (its mask reads all false): the call is traced by
    # metamem's own models, as without the fake GPU (its recording held
    # 3,075 B more here).
    if not os.path.exists(os.path.join(ORACLE, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={ORACLE!r} holds no fake GPU to run real torch on")
    import metamem

    def masked_rows():
        x = torch.randn(100000, 64, device="cuda")
        x[x[:, 0] > 0] = torch.ones(64, device="cuda")

    peaks = []
    for fake_gpu in ("", ORACLE):
        with metamem.trace(device="cuda", gpu="H100-80GB", fake_gpu=fake_gpu) as t:
            masked_rows()
        peaks.append((t.step_peaks, t.reserved_peak_bytes))
    assert peaks[0] == peaks[1]


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB", "T4"], list(real_gpu.TRAINING_OP_CASES)))
def test_activations_losses_pooling_and_resampling_hold_what_real_torch_holds(gpu, case):
    # A third probe (2026-12-04) of ops no sweep had put at a peak, forward
    # and backward. Before: pdist's backward held its result alone (of 1024
    # x 64 floats on the H100, 2,620,416 B traced against 438,830,080 B
    # real): each pair's share of both rows' gradients in a buffer of
    # (n - 1) x n x m, then its sum over pairs, with that sum's staging
    # (meta/CudaReduction.cpp); fractional max pooling's gradient lacked
    # its copy of the broadcast output's gradient, made before the input's
    # gradient (16 x 64 x 56² floats: 32,113,664 B against 35,324,928 B;
    # meta/CudaPooling.cpp); multi-margin and multilabel margin losses their
    # per-sample temporary and its sum, and their backwards' contiguous
    # operands (a transposed 2 x 1,000,000: 28,973,056 B against
    # 32,001,024 B); binary cross entropy its reduction's own 0-dim result
    # and staging (meta/CudaReduction.cpp); embedding_renorm_ (an
    # embedding's max_norm) all it holds: a buffer of the ids' size, their
    # flat sort, the distinct ids, their count and cub's storage to select
    # them (a million ids in place: 60,428,800 B traced against 109,206,016
    # B real; meta/CudaSort.cpp).
    assert_as_real_torch(gpu, case)


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB", "T4"], list(real_gpu.FOURTH_PROBE_CASES)))
def test_resampling_norms_gathers_and_pooling_hold_what_real_torch_holds(gpu, case):
    # A fourth probe (2026-12-04). Before: RMS norm (torch.nn.RMSNorm,
    # F.rms_norm) held none of layer norm's copies and block sums, whose
    # kernels it runs (8 x 128 x 768 floats: 6,302,720 B traced against
    # 9,448,448 B real; 131,072 rows of 64: 67,637,248 B against
    # 102,763,520 B; meta/CudaNormalization.cpp); antialiased resampling's
    # gradient lacked its copy of a broadcast output gradient (4,195,328 B
    # against 4,719,616 B; meta/CpuLayerModel.cpp).
    assert_as_real_torch(gpu, case)


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB", "T4"], list(real_gpu.SYNC_BATCH_NORM_CASES)))
def test_sync_batch_norms_kernels_hold_what_real_torch_holds(gpu, case):
    # Before (2026-12-04) no meta kernel: SyncBatchNorm stopped a trace.
    # The outputs as CUDA lays them out, and over channels-last inputs the
    # statistics' and the gradient's reductions staged across blocks as
    # native batch norm's are (meta/CudaNormalization.cpp).
    assert_as_real_torch(gpu, case)


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "T4"], real_gpu.GROUP_NORM_CASES))
def test_group_norm_holds_its_accumulators_as_real_torch(gpu, case):
    # Before: the scale and shift (2 x N x C fp32) of the forward, the
    # backward's per-channel sums and coefficients, and 16-bit inputs' fp32
    # statistics were missing.
    assert_as_real_torch(gpu, case)


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "T4"], real_gpu.LAYER_NORM_CASES))
def test_layer_norm_holds_its_copies_and_block_sums_as_real_torch(gpu, case):
    # Before: the contiguous copies of a permuted input (forward and
    # backward) and of a transposed gradient, and the weight's and bias's
    # gradients summed by blocks of rows, were missing; with group norm's,
    # a diffusers UNet's reserved was 2 MiB off.
    assert_as_real_torch(gpu, case)


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "T4"], real_gpu.REDUCTION_CASES))
def test_losses_means_and_variances_hold_their_temporaries_and_staging_as_real_torch(gpu, case):
    # Before: a reduced loss's elementwise temporary (as large as its input)
    # and a mean's staging buffer, where its blocks split each output's
    # inputs, were missing; a variance's too (Welford's 16-byte
    # accumulators: the std over the rows of 8192 x 256 floats held
    # 8,389,632 B traced where real torch holds 75,499,008 B).
    assert_as_real_torch(gpu, case)


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "T4"], real_gpu.GRADIENT_COPY_CASES))
def test_backward_kernels_copy_a_broadcast_gradient_as_real_torch(gpu, case):
    # Upsampling, average and adaptive pooling, 3-d max pooling and
    # reflection padding read the output's gradient contiguous, a copy after
    # the input's gradient where it is broadcast (x.sum().backward()); a
    # softmax's product with such a gradient is already contiguous; a
    # log_softmax reads a strided gradient contiguous. Before: no copy (the
    # bilinear upsampling of 4 x 16 x 32 x 32: 1,312,256 B against
    # 1,573,888 B), and the softmax one copy too many (1,281,024 B against
    # 1,025,024 B).
    assert_as_real_torch(gpu, case)


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "T4"], real_gpu.NATIVE_CONVOLUTION_CASES))
def test_native_convolutions_make_their_gradients_between_their_columns_as_real_torch(gpu, case):
    # Before: the columns and copies were one block after every gradient;
    # slow_conv2d's backward makes the input's gradient, its columns and
    # cuBLAS's workspace, then the bias's and the weight's gradients.
    assert_as_real_torch(gpu, case)


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "A100-80GB"], real_gpu.OTHER_KERNEL_CASES))
def test_embeddings_dropout_and_flash_allocate_in_their_kernels_order(gpu, case):
    # Before: an embedding's copy of ids it cannot view flat, and its
    # gradient's, came after the output (or were missing); dropout's mask
    # came after its output; flash's forward with dropout lacked a 16-byte
    # temporary (a BERT masked LM in bf16 autocast differed on all three).
    assert_as_real_torch(gpu, case)


@pytest.mark.parametrize("module", ["LSTM", "GRU", "RNN"])
def test_an_rnn_with_cudnn_on_runs_torchs_own_cells_as_with_cudnn_off(module):
    # metamem's fake cuda has no cuDNN: an RNN module built and run with
    # cuDNN on (torch's default) does not flatten its weights for it (which
    # read their addresses and stopped the trace) and runs layer by layer
    # on torch's own cells, as real torch runs it with cuDNN off (checked
    # against the fake GPU above). cuDNN's flag is the user's again after.
    import metamem
    import torch

    def events(cudnn):
        with metamem.trace(device="cuda", gpu="A100-80GB") as t:
            torch.backends.cudnn.enabled = cudnn
            try:
                rnn = getattr(torch.nn, module)(64, 64, 2, batch_first=True, bidirectional=True).cuda()
                rnn(torch.randn(4, 16, 64, device="cuda", requires_grad=True))[0].sum().backward()
                assert torch.backends.cudnn.enabled is cudnn
            finally:
                torch.backends.cudnn.enabled = True
        return real_gpu.traced_events(t)

    acceptable = torch.backends.cudnn.is_acceptable
    with_cudnn = events(True)
    assert with_cudnn == events(False) and len(with_cudnn) > 100
    assert torch.backends.cudnn.is_acceptable is acceptable and torch.nn.modules.rnn._VF is torch._VF


@pytest.mark.parametrize("gpu, case", one_gpu_each(["H100-80GB", "T4"], real_gpu.CTC_CASES))
def test_ctc_loss_takes_the_kernels_real_torch_takes_and_holds_what_they_hold(gpu, case):
    # Before: lengths as tensors stopped a trace at _use_cudnn_ctc_loss.Tensor
    # and lengths as lists with the mean at the tensor libtorch writes their
    # values into; cuDNN's CTC had no kernel; torch's own kernels lacked the
    # lengths and offsets they put on the device, and made the likelihoods
    # before log-alpha.
    assert_as_real_torch(gpu, case)


def test_ctc_loss_with_cudnns_shape_and_lengths_on_the_host_stops_as_real_torch_does():
    # libtorch's rule reads the lengths wherever they are and picks cuDNN,
    # whose kernel then finds them on another device than its inputs.
    import metamem
    import torch
    import torch.nn.functional as F

    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        with metamem.trace(device="cuda", gpu="H100-80GB"):
            log_probs = torch.randn(50, 16, 20, device="cuda", requires_grad=True).log_softmax(2)
            targets = torch.randint(1, 20, (16 * 30,), dtype=torch.int32, device="cuda")
            on_the_host = torch.tensor([50] * 16, dtype=torch.int32), torch.tensor([30] * 16, dtype=torch.int32)
            F.ctc_loss(log_probs, targets, *on_the_host)
