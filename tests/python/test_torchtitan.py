"""torchtitan's Llama 3 training, traced per rank (metamem.torchtitan)."""

import pytest

import metamem
import metamem.torchtitan as titan


@pytest.mark.parametrize("flavor, world, gpu", [("8B", 8, "H100-80GB"), ("70B", 64, "A100-80GB"),
                                                ("405B", 128, "H100-80GB")])
def test_each_preset_fits_the_gpus_it_was_written_for(flavor, world, gpu):
    # torchtitan's train_configs say which GPUs each preset is for (8B:
    # eight; 70B: 64 A100s; 405B: 128 H100s, there with float8, here in
    # bf16). A rank must reserve no more than the context leaves.
    t = titan.trace(flavor, world_size=world, gpu=gpu)
    assert t.reserved_peak_bytes <= metamem.gpu_memory(gpu)["allocator_bytes"]
    assert len(t.step_peaks) == 2


def test_activation_checkpointing_lowers_the_peak_in_torchtitans_order():
    peaks = {mode: max(titan.trace("debugmodel", activation_checkpoint=mode).step_peaks)
             for mode in ("none", "selective", "full")}
    assert peaks["none"] > peaks["selective"] > peaks["full"]


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
                             "recompute": "full"}
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
])
def test_the_command_line_names_bad_torchtitan_flags(flags, message, capsys):
    from metamem import cli

    assert cli.main(["profile", *flags]) == 2
    assert message in capsys.readouterr().err
