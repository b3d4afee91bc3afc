"""torchtitan's Llama 3 training, traced per rank (metamem.torchtitan)."""

import pytest

import metamem
import metamem.torchtitan as titan


@pytest.mark.parametrize("flavor, world, gpu", [("8B", 8, "H100-80GB"), ("70B", 64, "A100-80GB"),
                                                ("405B", 128, "H100-80GB")])
def test_each_preset_fits_the_gpus_it_was_written_for(flavor, world, gpu):
    # torchtitan's train_configs say which GPUs each preset is for (8B:
    # eight; 70B: 64 A100s; 405B: 128 H100s, there compiled with float8,
    # here eager in bf16: compiling a 405B block takes minutes). A rank must
    # reserve no more than the context leaves.
    t = titan.trace(flavor, world_size=world, gpu=gpu, compile=False, float8=False)
    assert t.reserved_peak_bytes <= metamem.gpu_memory(gpu)["allocator_bytes"]
    assert len(t.step_peaks) == 2


def test_activation_checkpointing_lowers_the_peak_in_torchtitans_order():
    peaks = {mode: max(titan.trace("debugmodel", activation_checkpoint=mode).step_peaks)
             for mode in ("none", "selective", "full")}
    assert peaks["none"] > peaks["selective"] > peaks["full"]


def test_a_preset_compiled_with_float8_is_traced_as_torchtitan_runs_it():
    # 405B's settings on the debug model: float8 linears (FSDP2 all-gathers
    # their weights in float8), each block and the loss compiled. The config
    # is torchtitan's, and so is every step that follows from it.
    assert (titan.PRESETS["405B"].compile, titan.PRESETS["405B"].float8) == (True, True)
    config = titan.job_config("debugmodel", compile=True, float8=True)
    assert config.model.converters == ["quantize.linear.float8"]
    assert config.quantize.linear.float8.enable_fsdp_float8_all_gather
    import torch._inductor.config as inductor

    before = inductor._micro_pipeline_tp
    peaks = {settings: titan.trace("debugmodel", local_batch_size=2, seq_len=256, activation_checkpoint="none",
                                   compile=settings[0], float8=settings[1]).step_peaks
             for settings in ((False, False), (True, False), (True, True))}
    assert inductor._micro_pipeline_tp == before  # torchtitan's async TP setting is put back
    # Compiled, backward keeps less; with float8 less again (step 2: step 1
    # also holds what Inductor benchmarks with while it compiles, as a
    # real first step does).
    assert peaks[True, True][1] < peaks[True, False][1] < peaks[False, False][1]


def test_float8_is_refused_where_the_gpu_has_none():
    with pytest.raises(ValueError, match="only supported on SM89 or later"):  # torchtitan's words
        titan.trace("debugmodel", gpu="A100-80GB", float8=True, local_batch_size=1, seq_len=128)


def test_bad_presets_are_refused():
    with pytest.raises(ValueError, match="unknown flavor"):
        titan.job_config("7B")


def test_the_command_line_traces_a_rank_of_a_preset_and_searches_its_layouts(capsys):
    # profile: the preset's layout unless the flags change it, the rank named.
    import json

    from metamem import cli

    assert cli.main(["profile", "--torchtitan", "debugmodel", "--tp", "2", "--dp", "4", "--rank", "5",
                     "--recompute", "full", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["job"] == {"data_parallel": 4, "tensor_parallel": 2, "rank": 5, "sharding": "fsdp2",
                             "recompute": "full", "compile": False, "float8": False}
    assert max(report["predicted"]["step_peaks"]) == max(
        titan.trace("debugmodel", world_size=8, rank=5, tensor_parallel=2, activation_checkpoint="full").step_peaks)
    # fit --search: tensor parallel 1, 2, 4, 8 with FSDP2 over the rest, each
    # activation checkpointing mode; the preset's own layout (tp 2,
    # selective) finds what plain fit finds.
    memory = ["--gpu", "T4", "--memory", "2GiB", "--max-batch", "64", "--format", "json"]
    assert cli.main(["fit", "--torchtitan", "debugmodel", *memory]) == 0
    largest = json.loads(capsys.readouterr().out)["largest_batch"]
    assert cli.main(["fit", "--torchtitan", "debugmodel", "--search", "--gpus", "8", *memory]) == 0
    found = json.loads(capsys.readouterr().out)
    rows = {(row["tp"], row["recompute"]): row for row in found["layouts"]}
    assert set(rows) == {(tp, mode) for tp in (1, 2, 4, 8) for mode in ("none", "selective", "full")}
    assert rows[2, "selective"]["local_batch"] == largest >= 1
    assert all(row["dp"] * row["tp"] == 8 for row in found["layouts"])
    assert all(row["reserved_bytes"] is None or row["reserved_bytes"] <= row["allocator_bytes"]
               for row in found["layouts"])


@pytest.mark.parametrize("flags, message", [
    (["--torchtitan", "7B"], "unknown torchtitan flavor"),
    (["--torchtitan", "8B", "--dtype", "bf16"], "--dtype: not for --torchtitan"),
    (["--torchtitan", "8B", "--tp", "2", "--rank", "8", "--dp", "4"], "--rank must be in [0, 8)"),
    (["--hf", "gpt2", "--recompute", "full"], "--recompute is for --torchtitan"),
    (["--hf", "gpt2", "--compile", "on"], "--compile and --float8 are for --torchtitan"),
])
def test_the_command_line_names_bad_torchtitan_flags(flags, message, capsys):
    from metamem import cli

    assert cli.main(["profile", *flags]) == 2
    assert message in capsys.readouterr().err
