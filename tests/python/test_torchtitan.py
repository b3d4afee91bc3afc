"""torchtitan's Llama 3 training, traced per rank (metamem.torchtitan)."""

import gc
import json
import os

import pytest
import torch
import torch._inductor.config as inductor

import metamem
import metamem.torchtitan as titan
from ci_subset import full

ORACLE = os.environ.get("METAMEM_ORACLE", "")


@pytest.mark.parametrize("flavor", list(titan.PRESETS))
def test_presets_are_torchtitans_config_registry(flavor):
    from torchtitan.components.quantization.float8 import Float8Linear
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    preset = titan.PRESETS[flavor]
    # torchtitan's float8 converter asks the GPU, and turns Inductor's
    # emulate_precision_casts on for the process (the trace puts it back).
    with metamem.trace(device="cuda"):
        config = titan.trainer_config(flavor)
    modes = {SelectiveAC.Config: "selective", FullAC.Config: "full", type(None): "none"}
    assert (config.training.local_batch_size, config.training.seq_len, config.parallelism.tensor_parallel_degree,
            modes[type(config.activation_checkpoint)], config.compile.enable,
            config.compile.enable_async_tensor_parallel) == (
        preset.local_batch_size, preset.seq_len, preset.tensor_parallel, preset.activation_checkpoint,
        preset.compile, preset.async_tensor_parallel)
    float8 = [fqn for fqn, _, _, _ in config.model_spec.model.traverse(Float8Linear.Config)]
    assert bool(float8) == preset.float8 and "lm_head" not in float8  # the output layer stays in bf16
    assert not config.training.disable_cuda_graphs  # every preset captures its forward and backward


@pytest.mark.parametrize("flavor, world, gpu", [("8B", 8, "H100-80GB"),
                                                pytest.param("70B", 64, "A100-80GB", marks=full),
                                                ("405B", 128, "H100-80GB")])
def test_each_preset_fits_the_gpus_it_was_written_for(flavor, world, gpu):
    # 8B on eight GPUs, 70B on 64 A100s, 405B on 128 H100s (there compiled
    # with float8, here eager in bf16: compiling a 405B block takes a while).
    # A rank must reserve no more than the context leaves.
    t = titan.trace(flavor, world_size=world, gpu=gpu, compile=False, float8=False)
    assert t.reserved_peak_bytes <= metamem.gpu_memory(gpu)["allocator_bytes"]
    assert len(t.step_peaks) == 2


def test_activation_checkpointing_lowers_the_peak_in_torchtitans_order():
    peaks = {mode: max(titan.trace("debugmodel", activation_checkpoint=mode).step_peaks)
             for mode in ("none", "selective", "full")}
    assert peaks["none"] > peaks["selective"] > peaks["full"]


def test_a_preset_compiled_with_float8_is_traced_as_torchtitan_runs_it():
    # 405B's settings on the debug model: rowwise float8 linears, each block
    # and the loss compiled. The config is torchtitan's, and so is every
    # step that follows from it; what torchtitan sets for the process is put
    # back after.
    settings = inductor.get_config_copy()
    peaks = {run: max(titan.trace("debugmodel", local_batch_size=2, seq_len=256, activation_checkpoint="none",
                                  compile=run[0], float8=run[1]).step_peaks)
             for run in ((False, False), (True, False), (True, True))}
    assert inductor.get_config_copy() == settings and gc.isenabled()
    assert torch.autograd.is_multithreading_enabled()
    # Compiled, backward keeps less; with float8 less again.
    assert peaks[True, True] < peaks[True, False] < peaks[False, False]


def test_ranks_of_an_even_layout_run_the_graphs_one_of_them_compiled():
    # A rank's process groups are named for their part in the job, and
    # where tensor parallelism splits every size evenly no graph depends on
    # where a rank lies: rank 3 of tensor parallel 2 x FSDP2 over 2 runs
    # the graphs rank 0's trace compiled, and holds what it holds when it
    # compiles its own.
    from torch._dynamo.utils import counters

    settings = dict(world_size=4, tensor_parallel=2, compile=True, float8=False, local_batch_size=2, seq_len=256,
                    activation_checkpoint="none")

    def run(rank):
        graphs = counters["stats"]["unique_graphs"]
        t = titan.trace("debugmodel", rank=rank, **settings)
        return (t.step_peaks, t.reserved_peak_bytes), counters["stats"]["unique_graphs"] - graphs

    torch._dynamo.reset()
    assert run(0)[1] > 0
    shared, compiled = run(3)
    torch._dynamo.reset()
    assert compiled == 0 and shared == run(3)[0]
    # The 8B preset's sequence of 8,190 tokens does not split over 4.
    assert titan._splits_evenly("debugmodel", tensor_parallel=2)
    assert not titan._splits_evenly("8B", tensor_parallel=4, seq_len=8190)


def test_float8_is_refused_where_the_gpu_has_none():
    with pytest.raises(ValueError, match="only supported on NVIDIA SM89 or later"):  # torchtitan's words
        titan.trace("debugmodel", gpu="A100-80GB", float8=True, local_batch_size=1, seq_len=128)


def test_bad_presets_are_refused():
    with pytest.raises(ValueError, match="unknown flavor"):
        titan.trainer_config("7B")
    with pytest.raises(ValueError, match="unknown flavor '9B': one of debugmodel, 8B"):  # was KeyError: '9B'
        titan.trace("9B")
    # 0 took the preset's batch: a trace of another batch than the one asked.
    with pytest.raises(ValueError, match="local_batch_size must be a positive int, got 0"):
        titan.trainer_config("debugmodel", local_batch_size=0)
    with pytest.raises(ValueError, match="none, selective or full"):
        titan.trainer_config("debugmodel", activation_checkpoint="op")


# torchtitan's own Trainer stepped as its training loop steps it, each
# step's max allocated and max reserved: run by real torch on the fake GPU
# with torch's fake process group (torchtitan's comm mode "fake_backend") as
# a rank of 8, and traced as that rank, where the trace's process group is
# made already and torchtitan takes it. `cold_inductor` turns Inductor's
# caches off, so that the real run autotunes FlexAttention's kernels as a
# trace does, allocating the benchmarks' buffers (docs/compile.md). The real
# run collects each compile's garbage as a trace does (COLLECTING_COMPILES):
# otherwise it holds blocks in it until Python's next collection (the debug
# model one int32 [8, 2048], a pipeline rank one microbatch's
# packed-document mask).
TRAINER_STEPS = """
import torch
import torch._inductor.config as inductor
import metamem.torchtitan as titan
from torchtitan.trainer import Trainer


def trainer_steps(cold_inductor=False, **overrides):
    config = titan.trainer_config("debugmodel", **overrides)
    config.comm.mode = "fake_backend"
    torch.autograd.set_multithreading_enabled(False)  # as torchtitan's init_distributed does first
    peaks = []
    with inductor.patch(force_disable_caches=cold_inductor), titan.stages_told_their_shapes(config):
        trainer = Trainer(config)
        batches = trainer.batch_generator(trainer.dataloader)
        for _ in range(2):
            torch.cuda.reset_peak_memory_stats()
            trainer.step += 1
            trainer.train_step(batches)
            peaks.append([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()])
    return peaks
"""


def real_and_traced(rank, **overrides):
    """trainer_steps(**overrides) as rank `rank` of 8 on an H100: real
    torch's peaks on the fake GPU and the trace's."""
    if not os.path.exists(os.path.join(ORACLE, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={ORACLE!r} holds no fake GPU to run real torch on")
    import metamem._metamem as native
    from real_torch_on_fake_gpu import COLLECTING_COMPILES, PROLOGUE, measure

    program = (PROLOGUE + f'import os\nos.environ.update(NGPU="8", RANK="{rank}", LOCAL_RANK="{rank}", '
               f'WORLD_SIZE="8")\n' + COLLECTING_COMPILES + TRAINER_STEPS +
               f"print(json.dumps(trainer_steps(**{overrides!r})))\n")
    real = measure(ORACLE, native.gpu("H100-80GB"), program)
    exec(TRAINER_STEPS, globals())
    with metamem.trace(device="cuda", gpu="H100-80GB", world_size=8, rank=rank, values="placeholder",
                       host_tensors="host"):
        traced = trainer_steps(**overrides)  # noqa: F821 (defined by the exec above)
    assert len(traced) == len(real) == 2
    return real, traced


@pytest.mark.parametrize("cuda_graphs", [True, pytest.param(False, marks=full)],
                         ids=["as shipped", "without CUDA graphs"])
def test_the_debug_model_against_torchtitans_trainer_on_the_fake_gpu(cuda_graphs):
    # As shipped, step 2 captures the CUDA graph, in which activation
    # checkpointing's first get_rng_state makes the CUDA generator's seed
    # and offset for the graph (docs/distributed.md).
    real, traced = real_and_traced(0, cold_inductor=True, cuda_graphs=cuda_graphs)
    assert traced == real


@pytest.mark.parametrize("rank", [pytest.param(0, marks=full), 4], ids=["first stage's rank", "last stage's rank"])
def test_a_pipeline_rank_against_torchtitans_trainer_on_the_fake_gpu(rank):
    # Pipeline parallel 2 x FSDP2 over 4: torchtitan's interleaved schedule
    # runs stages 0 and 2 on pipeline rank 0, 1 and 3 (the loss) on rank 1,
    # in 8 microbatches of one sequence.
    real, traced = real_and_traced(rank, cold_inductor=True, pipeline_parallel=2, seq_len=256)
    assert traced == real


def test_a_pipelines_largest_batch_is_a_multiple_of_its_microbatches():
    # Two microbatches (one a pipeline rank) of one sequence, then of two,
    # ...: under a cap of 3, one sequence each (both pipeline ranks traced);
    # under a cap of 1, not even that (nothing traced).
    assert titan.largest_batch("debugmodel", world_size=2, most=1, pipeline_parallel=2) == 0
    assert titan.largest_batch("debugmodel", world_size=2, most=3, pipeline_parallel=2, seq_len=256) == 2


def test_a_pipeline_stage_is_told_llamas_residual_stream_and_checks_it():
    import torchtitan.distributed.pipeline_parallel as pipeline

    built = pipeline.PipelineStage
    config = titan.trainer_config("debugmodel", pipeline_parallel=2, seq_len=256)
    with metamem.trace(device="cuda", world_size=2, rank=1), titan.stages_told_their_shapes(config):
        # the last of two stages: the hidden states [1, 256, 256] in bf16 in, and out
        stage = pipeline.PipelineStage(torch.nn.Linear(256, 256, dtype=torch.bfloat16), 1, 2, torch.device("cuda"))
        assert stage._user_meta.inputs[0].shape == stage._user_meta.outputs[0].shape == (1, 256, 256)
        stage.submod(torch.zeros(1, 256, 256, dtype=torch.bfloat16, device="cuda"))
        with pytest.raises(RuntimeError, match=r"stage 1 receives \(1, 128, 256\) torch.bfloat16, where metamem "
                                               r"told its schedule \(1, 256, 256\)"):
            stage.submod(torch.zeros(1, 128, 256, dtype=torch.bfloat16, device="cuda"))
    assert pipeline.PipelineStage is built


def test_the_command_line_traces_a_rank_of_a_preset_and_searches_its_layouts(capsys):
    # profile: the preset's layout unless the flags change it, the rank named.
    from metamem import cli

    assert cli.main(["profile", "--torchtitan", "debugmodel", "--tp", "2", "--dp", "4", "--rank", "5",
                     "--recompute", "full", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["job"] == {"data_parallel": 4, "tensor_parallel": 2, "pipeline_parallel": 1, "microbatches": 1,
                             "rank": 5, "sharding": "fsdp2", "recompute": "full", "compile": False, "float8": False}
    assert max(report["predicted"]["step_peaks"]) == max(
        titan.trace("debugmodel", world_size=8, rank=5, tensor_parallel=2, activation_checkpoint="full").step_peaks)
    # A pipeline's rank: its stage is the rank's place in the outermost dimension.
    assert cli.main(["profile", "--torchtitan", "debugmodel", "--pp", "2", "--tp", "2", "--rank", "6",
                     "--seq", "256"]) == 0
    printed = capsys.readouterr()
    assert ("as rank 6 of torchtitan's debugmodel on 8 GPUs: tensor parallel 2, FSDP2 over 2, pipeline parallel 2 "
            "(pipeline rank 1, 2 microbatches), recompute selective") in printed.out
    # What torchtitan's Trainer logs below an error and Inductor's
    # autotuning tables (the fake GPU's timings) are not the user's:
    # nothing on stderr.
    assert printed.err == ""
    # fit --search on two GPUs: tensor parallel 1 and 2 with FSDP2 over the
    # rest, and a pipeline of 2 (its two ranks traced, two microbatches),
    # each activation checkpointing mode, batches up to 2 (each trace
    # compiles torchtitan's FlexAttention and block mask: a few seconds);
    # the preset's own layout (tp 1, selective) finds what plain fit finds.
    memory = ["--gpu", "A100-80GB", "--memory", "2GiB", "--max-batch", "2", "--format", "json"]
    assert cli.main(["fit", "--torchtitan", "debugmodel", "--dp", "2", *memory]) == 0
    largest = json.loads(capsys.readouterr().out)["largest_batch"]
    assert cli.main(["fit", "--torchtitan", "debugmodel", "--search", "--gpus", "2", *memory]) == 0
    found = json.loads(capsys.readouterr().out)
    rows = {(row["pp"], row["tp"], row["recompute"]): row for row in found["layouts"]}
    assert set(rows) == {(pp, tp, mode) for pp, tp in ((1, 1), (1, 2), (2, 1))
                         for mode in ("none", "selective", "full")}
    assert rows[1, 1, "selective"]["local_batch"] == largest >= 1
    assert all(row["pp"] * row["dp"] * row["tp"] == 2 for row in found["layouts"])
    for mode in ("none", "selective", "full"):  # one batch of two microbatches on each of its ranks
        assert rows[2, 1, mode]["local_batch"] in (0, 2) and rows[2, 1, mode]["traces"] == 2
    assert all(row["reserved_bytes"] is None or row["reserved_bytes"] <= row["allocator_bytes"]
               for row in found["layouts"])


@pytest.mark.parametrize("flags, message", [
    (["--torchtitan", "7B"], "unknown torchtitan flavor"),
    (["--torchtitan", "8B", "--dtype", "bf16"], "--dtype: not for --torchtitan"),
    (["--torchtitan", "8B", "--tp", "2", "--rank", "8", "--dp", "4"], "--rank must be in [0, 8)"),
    (["--hf", "gpt2", "--recompute", "full"], "--recompute is for --torchtitan"),
    (["--hf", "gpt2", "--compile", "on"], "--compile and --float8 are for --torchtitan"),
    (["--torchtitan", "8B", "--microbatches", "2"], "--microbatches is for a pipeline"),
    (["--torchtitan", "8B", "--pp", "2", "--batch", "3"], "--batch 3 does not split into --microbatches 2"),
    (["--torchtitan", "8B", "--pp", "2", "--tp", "2", "--dp", "2", "--rank", "8"],
     "--rank must be in [0, 8) for --pp 2 x --dp 2 x --tp 2"),
])
def test_the_command_line_names_bad_torchtitan_flags(flags, message, capsys):
    from metamem import cli

    assert cli.main(["profile", *flags]) == 2
    assert message in capsys.readouterr().err
