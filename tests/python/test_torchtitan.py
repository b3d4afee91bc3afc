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
