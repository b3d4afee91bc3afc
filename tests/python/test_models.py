"""Models no one here wrote, built from configs (no weights): CI's subset of
the transformers, timm and diffusers sweeps beside this file."""

import json
import pickle

import pytest
import torch

import metamem
import metamem.cli
import metamem.hf
import metamem.timm
import diffusers_sweep
import timm_sweep
from hf_configs import BATCH, SEQ, reduced


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "qwen2", "gemma2", "mixtral", "bert", "t5", "bart", "whisper",
                                        "swin", "convnext", "clip"])
def test_two_adamw_steps_are_exact_on_cpu(model_type):
    # BART checks that its padding mask (ones) is all ones, ConvNeXt lists
    # its drop-path rates from torch.linspace: values the trace knows.
    step = metamem.hf.training_step(reduced(model_type), batch=BATCH, seq=SEQ, device="cpu")
    with metamem.trace(device="cpu") as t:
        step()
    assert len(t.step_peaks) == 2
    assert max(t.step_peaks) == metamem.achieved_cpu(step)


def test_random_token_ids_carry_values():
    # DeBERTa checks whether its random input ids hold a padding token: ids
    # drawn on torch's CPU generator answer as the real run's could.
    step = metamem.hf.training_step(reduced("deberta-v2"), batch=BATCH, seq=SEQ, device="cpu")
    with metamem.trace(device="cpu") as t:
        step()
    assert max(t.step_peaks) == metamem.achieved_cpu(step)


def test_a_model_whose_initializer_redraws_is_exact_without_values():
    # ViT's trunc_normal_ init draws again while a (random, float) value is
    # out of bounds, and asks whether one is: in a trace none is, as in the
    # real run, whose bounds lie 100 deviations out.
    step = metamem.hf.training_step(reduced("vit"), batch=BATCH, seq=SEQ, device="cpu")
    with metamem.trace(device="cpu") as t:
        step()
    assert max(t.step_peaks) == metamem.achieved_cpu(step)


def test_a_published_size_traces_on_fake_cuda():
    cfg = metamem.hf.config("gpt2")  # 124M
    t = metamem.hf.trace_step(cfg, batch=2, seq=1024, steps=1)
    states = t.json()["model_states"]
    assert states["param_bytes"] == 124_439_808 * 4
    # weights, gradients, AdamW's two moments, plus activations
    assert t.peak_bytes > 4 * states["param_bytes"]


def test_configs_from_a_type_an_architecture_a_file_or_an_object(tmp_path):
    by_type = metamem.hf.config("llama", num_hidden_layers=3)
    assert by_type.num_hidden_layers == 3
    assert metamem.hf.task_of(by_type) == ("causal", "LlamaForCausalLM")
    # BERT trains as a masked LM unless its architecture names another head
    assert metamem.hf.task_of(metamem.hf.config("bert")) == ("masked", "BertForMaskedLM")
    assert metamem.hf.task_of(metamem.hf.config("BertLMHeadModel")) == ("causal", "BertLMHeadModel")
    # an architecture other model types reuse (EXAONE's is LlamaForCausalLM) is its own type's
    assert metamem.hf.config("LlamaForCausalLM").model_type == "llama"
    path = tmp_path / "config.json"
    path.write_text(by_type.to_json_string())
    assert metamem.hf.config(str(path)).num_hidden_layers == 3
    assert metamem.hf.config(by_type, hidden_size=128).hidden_size == 128
    assert by_type.hidden_size != 128  # the object passed is not changed
    assert metamem.hf.config("gpt2", num_hidden_layers=2).n_layer == 2  # transformers' alias


def test_bad_input_is_a_named_error():
    with pytest.raises(ValueError, match="unknown Hugging Face model type or architecture 'lama'"):
        metamem.hf.config("lama")
    with pytest.raises(ValueError, match="has no attribute 'num_hiden_layers'"):
        metamem.hf.config("llama", num_hiden_layers=2)
    with pytest.raises(ValueError, match="dtype must be one of"):
        metamem.hf.training_step(metamem.hf.config("gpt2"), dtype="fp8")
    with pytest.raises(ValueError, match="unknown timm model 'resnet_9000'"):
        metamem.timm.create("resnet_9000")


REDUCED_GPT2 = ["--hf", "gpt2", "--hf-set", "num_hidden_layers=2", "--hf-set", "n_embd=64", "--hf-set", "n_head=2",
                "--hf-set", "vocab_size=256", "--batch", "2", "--seq", "16"]


def test_the_command_line_profiles_a_hub_config_exactly_on_cpu(capsys):
    assert metamem.cli.main(["profile", *REDUCED_GPT2, "--device", "cpu", "--achieved", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["achieved"]["peak_bytes"] == max(report["predicted"]["step_peaks"])
    assert metamem.cli.main(["profile", *REDUCED_GPT2, "--dtype", "bf16", "--gpu", "A100-80GB"]) == 0
    assert "predicted peak" in capsys.readouterr().out


def test_the_command_lines_outputs_are_the_zoos_for_a_hub_model(tmp_path, capsys):
    # The C++ front end's output flags, on the Python engine's models: the
    # same report model rendered the same ways.
    outputs = ["--html", str(tmp_path / "r.html"), "--snapshot", str(tmp_path / "s.pickle"),
               "--allocator-events", str(tmp_path / "e.txt")]
    assert metamem.cli.main(["profile", *REDUCED_GPT2, "--table", "modules", "--depth", "3", *outputs]) == 0
    printed = capsys.readouterr().out
    assert "GPT2LMHeadModel.transformer.h" in printed and "predicted peak" in printed
    assert '<svg id="timeline"' in (tmp_path / "r.html").read_text()
    assert pickle.loads((tmp_path / "s.pickle").read_bytes())["segments"]
    assert (tmp_path / "e.txt").read_text().count("\n") > 10
    assert metamem.cli.main(["profile", *REDUCED_GPT2, "--table", "nodes", "--format", "csv"]) == 0
    assert capsys.readouterr().out.startswith("name,op,module,phase")


def test_the_command_line_traces_one_rank_of_a_data_parallel_job(capsys):
    # FSDP2 on each GPT-2 block and on the model: a rank holds a shard of
    # the model states; the last rank's shards are padded (checked against
    # real gloo processes in test_distributed.py).
    def rank(*flags):
        assert metamem.cli.main(["profile", *REDUCED_GPT2, "--format", "json", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    one, first, last, hybrid = (rank(*flags) for flags in ([], ["--dp", "8"], ["--dp", "8", "--rank", "7"],
                                                           ["--dp", "8", "--fsdp", "hybrid", "--gpus-per-node", "4"]))
    assert first["job"] == {"data_parallel": 8, "tensor_parallel": 1, "pipeline_parallel": 1, "microbatches": None,
                            "rank": 0, "ranks_per_node": None, "sharding": "fsdp2"}
    assert hybrid["job"]["ranks_per_node"] == 4
    states = [report["model_states"]["param_bytes"] for report in (one, first, last, hybrid)]
    assert states[0] > states[3] > states[1] >= states[2]
    assert metamem.cli.main(["profile", *REDUCED_GPT2, "--dp", "8", "--rank", "3"]) == 0
    assert "as data-parallel rank 3 of 8 (FSDP2" in capsys.readouterr().out


REDUCED_LLAMA = ["--hf", "llama", "--hf-set", "num_hidden_layers=2", "--hf-set", "hidden_size=64", "--hf-set",
                 "intermediate_size=128", "--hf-set", "num_attention_heads=4", "--hf-set", "num_key_value_heads=2",
                 "--hf-set", "vocab_size=256", "--batch", "2", "--seq", "32"]


def test_the_command_line_splits_a_hub_model_by_its_tensor_parallel_plan(capsys):
    # transformers' tp_plan over --tp ranks, FSDP2 over the --dp ones (each
    # checked against real gloo processes in test_distributed.py): each
    # rank holds about 1/(dp x tp) of the model states, and the report
    # counts an NCCL communicator for each parallel dimension.
    def rank(*flags):
        assert metamem.cli.main(["profile", *REDUCED_LLAMA, "--format", "json", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    one, split, both = rank(), rank("--tp", "2", "--rank", "1"), rank("--tp", "2", "--dp", "4", "--rank", "5")
    assert both["job"] == {"data_parallel": 4, "tensor_parallel": 2, "pipeline_parallel": 1, "microbatches": None,
                           "rank": 5, "ranks_per_node": None, "sharding": "fsdp2"}
    whole, half, eighth = (report["model_states"]["param_bytes"] for report in (one, split, both))
    assert whole / 2 < half < whole / 2 * 1.01 and half / 4 <= eighth < half / 4 * 1.01  # norms stay whole

    def nccl(report):
        return {use["what"]: use["bytes"] for use in report["gpu_memory"]["beside_allocator"]}.get("NCCL buffers")
    assert nccl(both) == 2 * nccl(split) > 0
    assert metamem.cli.main(["profile", *REDUCED_LLAMA, "--tp", "2", "--dp", "4"]) == 0
    assert "as rank 0 of 8: tensor parallel 2 (transformers' tp_plan), FSDP2" in capsys.readouterr().out
    # A search on 4 GPUs: pipeline parallel 1 and 2 (two layers: a stage
    # needs one), tensor parallel 1 and 2 (its two key-value heads do not
    # split 4 ways), FSDP2 over the rest. A pipeline's batches are its two
    # microbatches' multiples, and both its stages are traced at each.
    assert metamem.cli.main(["fit", *REDUCED_LLAMA, "--gpu", "T4", "--memory", "400MiB", "--max-batch", "16",
                             "--search", "--gpus", "4", "--format", "json"]) == 0
    rows = {(row["pp"], row["tp"], row["dp"], row["recompute"]): row
            for row in json.loads(capsys.readouterr().out)["layouts"]}
    assert set(rows) == {(pp, tp, 4 // (pp * tp), r) for pp in (1, 2) for tp in (1, 2) for r in ("none", "layers")}
    assert rows[1, 2, 2, "none"]["allocator_bytes"] < rows[1, 1, 4, "none"]["allocator_bytes"]  # two communicators
    assert rows[2, 2, 1, "none"]["allocator_bytes"] == rows[1, 2, 2, "none"]["allocator_bytes"]
    assert all(1 <= row["local_batch"] and row["reserved_bytes"] <= row["allocator_bytes"] for row in rows.values())
    for (pp, tp, dp, recompute), row in rows.items():
        assert row["microbatches"] == (2 if pp == 2 else None) and row["local_batch"] % pp == 0
        assert [rank["rank"] for rank in row["ranks"]] == ([0, 2] if pp == 2 else [0])  # the last stage's first
        assert row["reserved_bytes"] == max(rank["reserved_bytes"] for rank in row["ranks"])
        assert row["peak_bytes"] == max(rank["peak_bytes"] for rank in row["ranks"]) <= row["reserved_bytes"]
        assert row["traces"] % pp == 0 and row["shown"].startswith("pp 2 x " if pp == 2 else "tp 2" if tp == 2 else "F")


REDUCED_LLAMA_4 = ["--hf", "llama", "--hf-set", "num_hidden_layers=4", "--hf-set", "hidden_size=64", "--hf-set",
                   "intermediate_size=128", "--hf-set", "num_attention_heads=4", "--hf-set", "num_key_value_heads=2",
                   "--hf-set", "vocab_size=256", "--seq", "32"]


def test_the_command_line_splits_a_hub_decoder_into_pipeline_stages(capsys):
    # transformers' split (each rank checked against real gloo processes in
    # test_distributed.py): of four layers in two stages, each holds two,
    # the first the embedding, the last the final norm and the head (not
    # tied in Llama): the stages' parameters are the model's. The batch is
    # a sample to each microbatch unless given, and the report counts the
    # pipeline's NCCL communicator.
    def rank(*flags):
        assert metamem.cli.main(["profile", *REDUCED_LLAMA_4, "--format", "json", *flags]) == 0
        return json.loads(capsys.readouterr().out)

    whole, first, last = rank(), rank("--pp", "2"), rank("--pp", "2", "--rank", "1")
    assert first["job"] == {"data_parallel": 1, "tensor_parallel": 1, "pipeline_parallel": 2, "microbatches": 2,
                            "rank": 0, "ranks_per_node": None, "sharding": "fsdp2"}
    params = [report["model_states"]["param_bytes"] for report in (whole, first, last)]
    assert params[1] + params[2] == params[0] and params[1] != params[2]
    beside = {use["what"] for use in first["gpu_memory"]["beside_allocator"]}
    assert "NCCL buffers" in beside and "NCCL buffers" not in {use["what"] for use in whole["gpu_memory"]["beside_allocator"]}
    assert metamem.cli.main(["profile", *REDUCED_LLAMA_4, "--pp", "2", "--dp", "2", "--microbatches", "4",
                             "--batch", "8", "--rank", "3"]) == 0
    assert ("as rank 3 of 4: pipeline parallel 2 (stage 1 as transformers splits the layers, 4 microbatches under "
            "torch's 1F1B schedule), FSDP2") in capsys.readouterr().out


def test_the_largest_batch_of_a_pipeline_fits_each_stage_in_whole_microbatches(capsys):
    # Both stages traced at each batch, the larger reserved counting; the
    # batch is the microbatches' multiple that fits where the next does not.
    cfg = metamem.hf.config("llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256)
    sharding, memory = metamem.Sharding(1, pipeline_parallel=2, microbatches=2), 400 << 20
    best = metamem.hf.largest_batch(cfg, seq=512, gpu="T4", memory=memory, sharding=sharding)
    capacity = metamem.gpu_memory("T4", memory, nccl_communicators=1)["allocator_bytes"]

    def reserved(batch):
        return max(metamem.hf.trace_step(cfg, batch, 512, gpu="T4", sharding=sharding, rank=rank).reserved_peak_bytes
                   for rank in (0, 1))
    assert best >= 2 and best % 2 == 0
    assert reserved(best) <= capacity < reserved(best + 2)
    assert metamem.cli.main(["fit", *REDUCED_LLAMA_4, "--seq", "512", "--gpu", "T4", "--memory", "400MiB", "--pp", "2",
                             "--format", "json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["largest_batch"] == best and all(int(batch) % 2 == 0 for batch in found["reserved_bytes"])
    assert found["ranks_traced"] == [0, 1]
    # --rank names the one rank to fit: the last stage alone takes more.
    assert metamem.cli.main(["fit", *REDUCED_LLAMA_4, "--seq", "512", "--gpu", "T4", "--memory", "400MiB", "--pp", "2",
                             "--rank", "1", "--format", "json"]) == 0
    last = json.loads(capsys.readouterr().out)
    assert last["ranks_traced"] == [1] and last["largest_batch"] > best


def test_fit_searches_the_layouts_of_a_data_parallel_job_in_one_process_or_several(capsys):
    # FSDP2 fully sharded and hybrid (two nodes of 8), each with and without
    # every layer recomputed; rank 0 traced. NCCL's communicators (one, or
    # two for hybrid) come off what the allocator gets.
    search = ["fit", *REDUCED_GPT2, "--seq", "256", "--gpu", "T4", "--memory", "360MiB", "--max-batch", "64",
              "--search", "--gpus", "16", "--format", "json"]
    assert metamem.cli.main(search) == 0
    found = json.loads(capsys.readouterr().out)
    layouts = {(row["sharding"], row["recompute"]): row for row in found["layouts"]}
    assert set(layouts) == {(s, r) for s in ("full", "hybrid") for r in ("none", "layers")}  # GPT-2: no tp_plan
    for row in found["layouts"]:
        assert 1 <= row["local_batch"] < 64 and row["reserved_bytes"] <= row["allocator_bytes"]
    for sharding in ("full", "hybrid"):
        assert layouts[sharding, "layers"]["local_batch"] >= layouts[sharding, "none"]["local_batch"]
    assert layouts["hybrid", "none"]["allocator_bytes"] < layouts["full", "none"]["allocator_bytes"]
    assert found["traces"] == sum(row["traces"] for row in found["layouts"])
    assert metamem.cli.main(search + ["--jobs", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["layouts"] == found["layouts"]
    # As Ray tasks on a Ray instance started for the search and stopped after it.
    assert metamem.cli.main(search + ["--ray", "local"]) == 0
    assert json.loads(capsys.readouterr().out)["layouts"] == found["layouts"]


def test_checkpoint_recomputes_the_fewest_layers_a_budget_needs_and_traces_the_plan(tmp_path, capsys):
    # Four GPT-2 blocks: a budget between the peaks without checkpointing
    # and with every block recomputed. The plan's peak is traced; one layer
    # fewer of the same kind does not fit; the least recompute wins.
    model = [*REDUCED_GPT2, "--hf-set", "num_hidden_layers=4", "--seq", "128", "--batch", "4"]
    cfg = metamem.hf.config("gpt2", num_hidden_layers=4, n_embd=64, n_head=2, vocab_size=256)

    def peak(checkpointing):
        t = metamem.hf.trace_step(cfg, batch=4, seq=128, checkpointing=checkpointing)
        return max(t.step_peaks), t.flops
    (plain, flops), (lowest, _) = peak(None), peak(True)
    budget = (plain + lowest) // 2
    page = tmp_path / "plan.html"
    assert metamem.cli.main(["checkpoint", *model, "--budget", str(budget), "--format", "json",
                             "--html", str(page)]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["units"] == [f"GPT2LMHeadModel.transformer.h.{i}" for i in range(4)]
    assert plan["unchecked_peak_bytes"] == plain and plan["step_flops"] == flops["total"]
    selective = ";keep=" in plan["policy_text"]
    layers = len(plan["policy"])
    assert plan["policy_text"].startswith(",".join(map(str, range(layers))))
    chosen = metamem.Checkpointing(layers, selective)
    assert peak(chosen)[0] == plan["peak_bytes"] <= budget
    assert peak(chosen)[1]["recompute"] == plan["recompute_flops"] > 0
    assert peak(metamem.Checkpointing(layers - 1, selective))[0] > budget
    other = metamem.Checkpointing(layers, not selective)  # the other kind recomputes more or does not fit
    assert peak(other)[0] > budget or peak(other)[1]["recompute"] >= plan["recompute_flops"]
    assert '<svg id="checkpoint-curve"' in page.read_text()
    # The table the zoo's plans print; a budget no plan reaches exits 1, naming the least reached.
    assert metamem.cli.main(["checkpoint", *model, "--budget", str(budget), "--solver", "layers"]) == 0
    assert "peak" in capsys.readouterr().out
    assert metamem.cli.main(["checkpoint", *model, "--budget", str(lowest // 2)]) == 1
    assert f"the least memory a traced plan reaches is" in capsys.readouterr().err


def test_checkpoint_plans_each_pipeline_stage_apart(tmp_path, capsys):
    # Two stages of two layers each: each stage's plan counts its own
    # layers and is traced on its first rank; the last stage (the head's
    # logits) and the first (two microbatches in flight) peak apart, so a
    # budget between the higher's peaks with and without recompute
    # recomputes there and, where the other fits as it is, nothing there.
    cfg = metamem.hf.config("llama", num_hidden_layers=4, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=256)
    sharding = metamem.Sharding(1, pipeline_parallel=2)

    def peak(rank, checkpointing):
        t = metamem.hf.trace_step(cfg, batch=4, seq=256, checkpointing=checkpointing, sharding=sharding, rank=rank)
        return max(t.step_peaks)
    plain, lowest = [peak(rank, None) for rank in (0, 1)], [peak(rank, True) for rank in (0, 1)]
    higher = plain.index(max(plain))
    budget = max((plain[higher] + lowest[higher]) // 2, plain[1 - higher])
    flags = ["checkpoint", *REDUCED_LLAMA_4, "--seq", "256", "--batch", "4", "--pp", "2", "--budget", str(budget)]
    page = tmp_path / "plan.html"
    assert metamem.cli.main([*flags, "--format", "json", "--html", str(page)]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert [(stage["stage"], stage["rank"], stage["fits"]) for stage in stages] == [(0, 0, True), (1, 1, True)]
    for stage in stages:
        assert stage["units"] == [f"LlamaForCausalLM.model.layers.{i}" for i in (2 * stage["stage"], 2 * stage["stage"] + 1)]
        assert stage["unchecked_peak_bytes"] == plain[stage["rank"]]
        plan = metamem.Checkpointing(len(stage["policy"]), ";keep=" in stage["policy_text"])
        assert stage["peak_bytes"] == peak(stage["rank"], plan) <= budget
        assert stage["job"]["rank"] == stage["rank"]
    assert stages[higher]["recompute_flops"] > 0
    assert stages[1 - higher]["policy_text"] == "none" or plain[1 - higher] > budget
    assert all((tmp_path / f"plan.stage{stage}.html").exists() for stage in (0, 1))
    # --rank plans that rank's stage alone; a budget no plan of a stage
    # reaches names the stage and exits 1, after the stages that fit.
    assert metamem.cli.main([*flags, "--rank", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("pipeline stage 1 of 2 (rank 1)") and "stage 0" not in out
    assert metamem.cli.main([*flags[:-1], str(min(lowest) - 1)]) == 1
    err = capsys.readouterr().err
    assert "pipeline stage 0 of 2 (rank 0): llama does not fit" in err and "pipeline stage 1 of 2 (rank 1)" in err
    # Without a pipeline, one plan, for the rank the flags name, whose job the report gives.
    assert metamem.cli.main(["checkpoint", *REDUCED_LLAMA_4, "--dp", "2", "--rank", "1", "--budget", "1GiB",
                             "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["rank"] == 1


def test_a_timm_models_first_blocks_recompute_exactly_on_cpu_and_checkpoint_finds_them(capsys):
    # ConvNeXt's nine blocks, the first two recomputed whole or keeping
    # their products (convolutions, linears): equal to the real CPU run.
    model = metamem.timm.create("test_convnext")
    assert [path for path, _ in metamem.timm.checkpoint_blocks(model)][:3] == [
        "stages.0.blocks.0", "stages.1.blocks.0", "stages.1.blocks.1"]
    peaks = {}
    for plan in (None, metamem.Checkpointing(2), metamem.Checkpointing(2, selective=True)):
        step = metamem.timm.training_step(model, batch=4, device="cpu", checkpointing=plan)
        with metamem.trace(device="cpu", modules=[model]) as t:
            step()
        assert max(t.step_peaks) == metamem.achieved_cpu(step, modules=[model]), plan
        peaks[plan] = max(t.step_peaks), t.flops["recompute"]
    assert peaks[None][0] > peaks[metamem.Checkpointing(2, selective=True)][0] > peaks[metamem.Checkpointing(2)][0]
    assert peaks[metamem.Checkpointing(2)][1] > peaks[metamem.Checkpointing(2, selective=True)][1] > 0
    # The blocks are put back: the model runs as it was built.
    assert all("forward" not in vars(block) for _, block in metamem.timm.checkpoint_blocks(model))
    budget = (peaks[None][0] + peaks[metamem.Checkpointing(2)][0]) // 2
    assert metamem.cli.main(["checkpoint", "--timm", "test_convnext", "--batch", "4", "--device", "cpu",
                             "--budget", str(budget), "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["units"][0] == "ConvNeXt.stages.0.blocks.0" and plan["peak_bytes"] <= budget < plan["unchecked_peak_bytes"]


def test_the_command_line_fits_a_timm_model_on_a_gpu(capsys):
    # 320 MiB of a T4, less its CUDA context: 40 SMs × 1024 threads × 1 KiB of stack and the driver's 213 MiB.
    memory = (320 - 40 - 213) << 20
    assert metamem.cli.main(["fit", "--timm", "test_vit", "--memory", "320MiB", "--gpu", "T4", "--format", "json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert fit["gpu_memory"]["allocator_bytes"] == memory
    reserved = {int(batch): size for batch, size in fit["reserved_bytes"].items()}
    best = fit["largest_batch"]
    assert best >= 1 and reserved[best] <= memory
    assert best + 1 in reserved and reserved[best + 1] > memory  # the bisection's last step: one more fails
    assert metamem.cli.main(["fit", "--timm", "test_vit", "--memory", "320MiB", "--cuda-context", "0", "--gpu", "T4",
                             "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["largest_batch"] > best


@pytest.mark.parametrize("args, message", [
    (["profile", "--hf", "lama"], "unknown Hugging Face model type"),
    (["profile", "--timm", "resnet_9000"], "unknown timm model"),
    (["profile", "--hf", "gpt2", "--hf-set", "n_layer"], "--hf-set expects KEY=VALUE"),
    (["profile", "--hf", "gpt2", "--achieved"], "--achieved is for profile --device cpu"),
    (["profile", "--hf", "gpt2", "--gpu", "V100"], "unknown GPU 'V100'"),
    (["fit", "--hf", "gpt2", "--memory", "lots"], "--memory expects a size"),
    (["fit", "--hf", "gpt2", "--memory", "200MiB", "--gpu", "T4"], "leaves nothing to the CUDA caching allocator"),
    (["profile", "--timm", "test_vit", "--hf-set", "x=1"], "are for --hf models"),
    (["profile", "--timm", "test_vit", "--depth", "0"], "--depth must be at least 1"),
    (["fit", "--timm", "test_vit", "--html", "fit.html"], "are for profile"),
    (["profile", "--timm", "test_vit", "--html", "/nonexistent/r.html"], "No such file or directory"),
    (["profile", "--hf", "gpt2", "--dp", "8", "--zero", "1"], "--hf models are sharded by FSDP2"),
    (["profile", "--hf", "gpt2", "--rank", "1"], "are for data parallelism: give --dp N"),
    (["profile", "--hf", "gpt2", "--dp", "4", "--rank", "4"], "--rank must be in [0, 4)"),
    (["profile", "--hf", "gpt2", "--dp", "12", "--fsdp", "hybrid"], "not a multiple of --gpus-per-node 8"),
    (["profile", "--hf", "gpt2", "--dp", "8", "--gpus-per-node", "4"], "--gpus-per-node is for --fsdp hybrid"),
    (["profile", "--timm", "test_vit", "--dp", "2"], "--dp and --tp are for --hf models"),
    (["profile", "--hf", "gpt2", "--tp", "2"], "gpt2 has no tensor-parallel plan"),
    (["profile", "--hf", "llama", "--hf-set", "num_key_value_heads=2", "--tp", "4"], "splits attention heads"),
    (["profile", "--hf", "llama", "--tp", "2", "--dp", "2", "--rank", "4"], "--rank must be in [0, 4)"),
    (["profile", "--hf", "llama", "--tp", "4", "--dp", "2", "--fsdp", "hybrid", "--gpus-per-node", "2"],
     "must hold whole tensor-parallel groups of --tp 4"),
    (["profile", "--hf", "llama", "--recompute", "full"], "--recompute is for --torchtitan"),
    (["profile", "--hf", "gpt2", "--pp", "2"], "GPT2LMHeadModel has no pipeline plan in transformers"),
    (["profile", "--hf", "bert", "--pp", "2"], "pipeline parallelism splits decoders that predict tokens"),
    (["profile", "--hf", "llama", "--hf-set", "num_hidden_layers=2", "--pp", "4"], "4 pipeline stages need a layer"),
    (["profile", "--hf", "llama", "--pp", "2", "--batch", "3"], "--batch 3 does not split into --microbatches 2"),
    (["profile", "--hf", "llama", "--microbatches", "4"], "--microbatches is for a pipeline"),
    (["profile", "--hf", "llama", "--pp", "2", "--rank", "2"], "--rank must be in [0, 2) for --pp 2 x --dp 1"),
    (["profile", "--timm", "test_vit", "--pp", "2"], "--pp and --microbatches are for --hf and --torchtitan"),
    (["checkpoint", "--hf", "gpt2", "--budget", "1GiB", "--pp", "2"], "GPT2LMHeadModel has no pipeline plan"),
    (["profile", "--hf", "gpt2", "--dp", "2", "--device", "cpu", "--achieved"], "of one process"),
    (["fit", "--hf", "gpt2", "--search"], "fit --search needs --gpus N"),
    (["profile", "--hf", "gpt2", "--search", "--gpus", "8"], "--search is for fit --hf"),
    (["fit", "--hf", "gpt2", "--search", "--gpus", "8", "--dp", "8"], "fit --search picks the layout"),
    (["fit", "--hf", "gpt2", "--gpus", "8"], "--gpus, --jobs and --ray are for fit --search"),
    (["fit", "--hf", "gpt2", "--search", "--gpus", "8", "--jobs", "0"], "--jobs must be positive"),
    (["fit", "--hf", "gpt2", "--search", "--gpus", "8", "--jobs", "2", "--ray", "local"], "give one"),
    (["fit", "--hf", "gpt2", "--ray", "auto"], "are for fit --search"),
    (["checkpoint", "--hf", "gpt2"], "checkpoint needs --budget"),
    (["checkpoint", "--hf", "gpt2", "--budget", "lots"], "--budget expects a size"),
    (["checkpoint", "--torchtitan", "8B", "--budget", "1GiB"], "torchtitan's presets recompute as torchtitan does"),
    (["checkpoint", "--hf", "gpt2", "--budget", "1GiB", "--checkpointing"], "chooses what to recompute itself"),
    (["checkpoint", "--hf", "gpt2", "--budget", "1GiB", "--table", "nodes"], "are for profile"),
    (["profile", "--hf", "gpt2", "--budget", "1GiB"], "are for checkpoint"),
    (["fit", "--hf", "gpt2", "--solver", "layers"], "are for checkpoint"),
])
def test_the_command_line_names_bad_input(args, message, capsys):
    assert metamem.cli.main(args) == 2
    assert message in capsys.readouterr().err


def test_the_python_api_names_a_size_that_is_not_positive():
    # A batch of 0 traced a step of empty tensors (timm: 267,383,232 B on an
    # H100, an answer for nothing); Hugging Face's stopped deep in the model
    # ("cannot reshape tensor of 0 elements").
    cfg = metamem.hf.config("gpt2", n_layer=1)
    for sizes, message in ((dict(batch=0), "batch must be a positive int, got 0"),
                           (dict(seq=-1), "seq must be a positive int, got -1"),
                           (dict(steps=0), "steps must be a positive int, got 0")):
        with pytest.raises(ValueError, match=message):
            metamem.hf.training_step(cfg, **sizes)
    with pytest.raises(ValueError, match="batch must be a positive int, got 0"):
        metamem.timm.training_step(metamem.timm.create("test_vit"), batch=0)


@pytest.mark.parametrize("name", ["test_byobnet", "test_convnext", "test_vit", "test_efficientnet", "resnet10t",
                                  "mobilenetv3_small_050", "poolformerv2_s12", "cpubone_nano",
                                  "deit_tiny_distilled_patch16_224"])
def test_timm_models_are_exact_on_cpu(name):
    # poolformer's group norms and cpubone's grouped convolutions run channels
    # last; DeiT's distilled head trains two outputs.
    model = metamem.timm.create(name)
    step = metamem.timm.training_step(model, timm_sweep.BATCH, "cpu")
    with metamem.trace(device="cpu", modules=[model]) as t:
        step()
    assert max(t.step_peaks) == metamem.achieved_cpu(step, modules=[model])


@pytest.mark.parametrize("name, make_step, reduced_config, full_config", diffusers_sweep.MODELS,
                         ids=["unet", "dit"])
def test_diffusers_denoisers_are_exact_on_cpu(name, make_step, reduced_config, full_config):
    traced, achieved = diffusers_sweep.exact_on_cpu(make_step, reduced_config)
    assert traced == achieved


@pytest.mark.parametrize("name,gpu,precision,cudnn", [
    ("transformers BERT masked LM (base width)", "A100-80GB", "bf16 autocast", False),  # was 1.5 MB under
    ("torchvision regnet_y_400mf", "T4", "f32", False),  # grouped convolutions; step 2 was 253,440 B under
    ("transformers OPT", "T4", "bf16 autocast", False),
    ("mixer with a custom autograd.Function", "T4", "f32", False),
    ("diffusers UNet2DConditionModel", "H100-80GB", "f32", False),  # step 2 reserved was 2 MiB over
    ("transformers siglip (hf_sweep's reduced size)", "H100-80GB", "f32", False),  # patches with padding "valid"
    ("timm coat_lite_tiny", "H100-80GB", "f32", False),  # softmax of a transposed view, depthwise convolutions of splits
    ("timm pvt_v2_b0", "H100-80GB", "f32", False),  # one-head attention; which of two equal blocks a convolution frees
    # torch's defaults: cuDNN on, cuDNN attention, which the fake GPU runs
    ("transformers BERT masked LM (base width)", "H100-80GB", "bf16 autocast", True),
    ("transformers llama (hf_sweep's reduced size)", "H100-80GB", "bf16 autocast", True),
    ("timm sequencer2d_s", "T4", "f32", True),  # cuDNN's LSTMs, flattened as the model moves; was 1.0 GB over
    ("torchvision lraspp_mobilenet_v3_large", "H100-80GB", "f32", True),  # segmentation: dilated, bilinear upsampling
    ("diffusers DiTTransformer2DModel (diffusers_sweep's reduced size)", "A100-80GB", "bf16 autocast", True),
])
def test_eager_steps_are_exact_against_real_torch_on_the_fake_gpu(name, gpu, precision, cudnn):
    # CI's subset of fake_gpu_sweep.py: max allocated and max reserved of
    # both steps, the trace's against real torch's on the fake GPU.
    import os
    import fake_gpu_sweep
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={oracle!r} holds no fake GPU to run real torch on")
    row = fake_gpu_sweep.run_one(name, gpu, precision, oracle, cudnn)
    assert fake_gpu_sweep.verdict(row) == "exact", row
