"""`metamem run SCRIPT ARGS`: an ordinary training script
(ordinary_training_script.py), unchanged, run under a trace and stopped
after its first optimizer steps, and a torchrun FSDP2 script
(torchrun_training_script.py) traced as each of its ranks; on a fake
cpu, against the same scripts run for real."""

import contextlib
import json
import os
import runpy
import sys
import textwrap

import pytest

import metamem
import metamem._run
import metamem.cli
from distributed_steps import torchrun_peaks

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ordinary_training_script.py")
TORCHRUN_SCRIPT = os.path.join(HERE, "torchrun_training_script.py")
BLOCK_SCRIPT = os.path.join(HERE, "block_training_script.py")


def line_of(text, path=SCRIPT):
    with open(path) as script:
        return next(number for number, line in enumerate(script, 1) if text in line)


def test_a_script_is_stopped_after_its_steps_and_reported(tmp_path, capsys):
    before = sys.argv[:], sys.path[:]
    argv = ["run", "--steps", "2", "--format", "json", SCRIPT, "--epochs", "3", "--out", str(tmp_path)]
    assert metamem.cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    # The GradScaler's check for infinities in scaler.step(), in both
    # steps, and the loss logged after the first (the run stopped inside
    # the second scaler.step), each named by the script's line.
    reads = [{"where": f"{os.path.relpath(SCRIPT)}:{line_of(text)}", "reads": reads}
             for text, reads in (("scaler.step(optimizer)", 2), ("loss.item()", 1))]
    assert report["run"] == {"script": SCRIPT, "optimizer_steps": 2, "stopped": True, "unsaved": [],
                             "values_read": reads}
    assert len(report["predicted"]["step_peaks"]) == 2 and report["optimizer"] == "AdamW"
    assert os.listdir(tmp_path) == []  # nothing after the second step ran
    assert (sys.argv, sys.path) == before


def test_a_script_that_ends_by_itself_is_exact_against_its_real_cpu_run(tmp_path, capsys):
    # 256 samples in batches of 64: four steps, fewer than the five asked.
    # Its torch.save writes nothing in the trace, and the report says where.
    # No loader workers: a worker hands the real process its batch in shared
    # memory, which the CPU allocator does not count; the trace collates it
    # in the process (docs/python.md).
    argv = [SCRIPT, "--epochs", "1", "--workers", "0", "--out", str(tmp_path)]
    assert metamem.cli.main(["run", "--device", "cpu", "--steps", "5", *argv]) == 0
    printed = capsys.readouterr().out
    assert "predicted peak" in printed and "ended by itself after 4 optimizer steps" in printed
    save = f"{os.path.relpath(SCRIPT)}:{line_of('torch.save(')}"
    assert f"torch.save at {save} wrote nothing" in printed
    assert metamem.cli.main(["run", "--device", "cpu", "--steps", "5", "--format", "json", *argv]) == 0
    report = json.loads(capsys.readouterr().out)
    # The script ran to its end (its marker is written) but saved nothing.
    assert report["run"]["unsaved"] == [save] and os.listdir(tmp_path) == ["finished"]
    os.remove(tmp_path / "finished")

    saved = sys.argv
    sys.argv = argv
    try:
        real = metamem.achieved_cpu(lambda: runpy.run_path(SCRIPT, run_name="__main__"))
    finally:
        sys.argv = saved
    assert sorted(os.listdir(tmp_path)) == ["finished", "model.pt"]
    assert max(report["predicted"]["step_peaks"]) == real


def test_a_budget_finds_the_blocks_of_the_scripts_model_to_recompute_exact_against_its_real_cpu_run(capsys):
    # The script's model is the first module called that has blocks; the
    # fewest of its first blocks are recomputed that bring the peak within
    # the budget, and the script run for real with them recomputed peaks
    # where the trace said.
    argv = [BLOCK_SCRIPT, "--steps", "2"]
    assert metamem.cli.main(["run", "--device", "cpu", "--format", "json", *argv]) == 0
    unchecked = max(json.loads(capsys.readouterr().out)["predicted"]["step_peaks"])
    budget = unchecked * 2 // 3
    assert metamem.cli.main(["run", "--device", "cpu", "--budget", str(budget), "--format", "json", *argv]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["units"] == [f"LM.blocks.{index}" for index in range(4)]
    assert plan["unchecked_peak_bytes"] == unchecked and plan["peak_bytes"] <= budget < unchecked
    assert plan["run"]["optimizer_steps"] == 2 and plan["recompute_flops"] > 0
    recomputed = int(plan["policy_text"].split(";")[0].split(",")[-1]) + 1
    checkpointing = metamem.Checkpointing(recomputed, selective=";keep=" in plan["policy_text"])

    from metamem import _run

    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.ExitStack() as exits:
            script = _run.ScriptRun(BLOCK_SCRIPT, steps=2)
            _run._recomputing_its_model(script, checkpointing, exits)
            real = metamem.achieved_cpu(lambda: runpy.run_path(BLOCK_SCRIPT, run_name="__main__"))
    finally:
        sys.argv = saved
    assert script.blocks == plan["units"]
    assert plan["peak_bytes"] == real

    # Where nothing fits, the least peak a plan reached; a script without
    # blocks, or a search's flags without a budget, is refused.
    assert metamem.cli.main(["run", "--device", "cpu", "--budget", "1MiB", *argv]) == 1
    assert "does not fit in 1.00 MiB" in capsys.readouterr().err
    assert metamem.cli.main(["run", "--device", "cpu", "--budget", "1MiB", SCRIPT, "--out", "unused"]) == 2
    assert "no blocks to recompute" in capsys.readouterr().err
    assert metamem.cli.main(["run", "--solver", "layers", *argv]) == 2
    assert "give --budget" in capsys.readouterr().err


def test_a_script_on_one_gpu_is_exact_against_real_torch_on_the_fake_gpu(tmp_path):
    # Its dataset and the batches its loader collates stay in host memory,
    # as in the real run; only .to(device) copies them onto the GPU.
    oracle = os.environ.get("METAMEM_ORACLE", "")
    if not os.path.exists(os.path.join(oracle, "libmetamem_fake_cuda_preload.so")):
        pytest.skip(f"METAMEM_ORACLE={oracle!r} holds no fake GPU to run real torch on")
    import metamem._metamem as native
    from real_torch_on_fake_gpu import PROLOGUE, measure

    argv = ["--epochs", "1", "--workers", "0", "--out", str(tmp_path)]
    real_run = PROLOGUE + textwrap.dedent(f"""
        import torch
        class Done(Exception):
            pass
        steps = []
        def after_step(optimizer, args, kwargs):
            steps.append(optimizer)
            if len(steps) == 2:
                raise Done()
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(after_step)
        sys.argv = [{SCRIPT!r}, *{argv!r}]
        try:
            runpy.run_path({SCRIPT!r}, run_name="__main__")
        except Done:
            pass
        print(json.dumps([torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()]))
    """)
    for gpu in ("H100-80GB", "T4"):
        real = measure(oracle, native.gpu(gpu), real_run)
        traced, run = metamem._run.trace_script(SCRIPT, argv, 2, "cuda", gpu, "placeholder")
        assert run.steps == 2
        allocated = traced.json()["predicted"]["allocator_allocated_peak_bytes"]
        assert [allocated, traced.reserved_peak_bytes] == real, gpu
    assert os.listdir(tmp_path) == []


def test_what_a_run_cannot_do_is_named(tmp_path, capsys):
    assert metamem.cli.main(["run", str(tmp_path / "absent.py")]) == 2
    assert "no script" in capsys.readouterr().err
    failing = tmp_path / "failing.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    assert metamem.cli.main(["run", str(failing)]) == 1
    assert "exited with status 3" in capsys.readouterr().err
    # Reading the loss, with values an error: the read is named.
    assert metamem.cli.main(["run", "--values", "error", SCRIPT, "--out", str(tmp_path)]) == 1
    assert "metamem" in capsys.readouterr().err


def test_a_script_that_fails_is_named_by_its_line_and_one_ended_by_os_exit_is_reported(tmp_path, capsys):
    # The script's own error was taken for bad input (exit 2, "metamem:
    # mat1 and mat2 ...", no line), and os._exit ended the process with no
    # report. A child the script forks still ends by the real os._exit.
    failing = tmp_path / "failing.py"
    failing.write_text("import torch\nmodel = torch.nn.Linear(4, 4)\nmodel(torch.randn(2, 5))\n")
    assert metamem.cli.main(["run", str(failing)]) == 1
    assert (f"metamem: {os.path.relpath(failing)}:3 raised RuntimeError: mat1 and mat2 shapes cannot be "
            "multiplied (2x5 and 4x4)") in capsys.readouterr().err
    failing.write_text("def step(:\n")  # no line of its own ran: named by the file
    assert metamem.cli.main(["run", str(failing)]) == 1
    assert f"metamem: {failing} raised SyntaxError: " in capsys.readouterr().err
    exiting = tmp_path / "exiting.py"
    exiting.write_text(
        "import multiprocessing, os, torch\n"
        "child = multiprocessing.get_context('fork').Process(target=print, args=('child',))\n"
        "child.start(); child.join(); assert child.exitcode == 0\n"
        "model = torch.nn.Linear(8, 8).cuda(); opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "model(torch.randn(2, 8, device='cuda')).sum().backward(); opt.step()\n"
        "os._exit(0)\n")
    assert metamem.cli.main(["run", "--format", "json", str(exiting)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["run"]["optimizer_steps"] == 1 and not report["run"]["stopped"]
    assert report["predicted"]["peak_bytes"] > 0


def test_a_torchrun_script_is_traced_as_each_rank_exact_against_real_processes(capsys):
    # Four ranks on a node, as `torchrun --nproc-per-node 4` starts them:
    # gloo on a CPU, 64 samples and two steps each. The last layer's 10
    # rows shard 3, 3, 3 and 1: rank 3 holds less. gloo's worker thread
    # drops a finished collective's tensors when it gets to it, so a real
    # run can peak higher than the step does: the least of three runs.
    real = torchrun_peaks(TORCHRUN_SCRIPT, [], 4)
    traced = {}
    for rank in range(4):
        argv = ["run", "--device", "cpu", "--nproc-per-node", "4", "--rank", str(rank), "--steps", "3",
                "--format", "json", TORCHRUN_SCRIPT]
        assert metamem.cli.main(argv) == 0
        report = json.loads(capsys.readouterr().out)  # rank 0's logged loss went to stderr
        run = report["run"]
        assert run["job"] == {"world_size": 4, "rank": rank, "nproc_per_node": 4}
        assert (run["optimizer_steps"], run["stopped"]) == (2, False)
        # Only rank 0 logs its loss, once per epoch's first step here.
        where = f"{os.path.relpath(TORCHRUN_SCRIPT)}:{line_of('loss.item()', TORCHRUN_SCRIPT)}"
        assert run["values_read"] == ([{"where": where, "reads": 1}] if rank == 0 else [])
        traced[rank] = max(report["predicted"]["step_peaks"])
        assert min(real[rank]) == traced[rank] and all(peak >= traced[rank] for peak in real[rank]), rank
    assert traced[3] < traced[0]


def test_a_torchrun_ddp_script_is_exact_against_real_gloo_processes(capsys):
    # The same script with DistributedDataParallel: its buckets, filled and
    # all-reduced in backward, rebuilt before the second forward. Before
    # 2026-12-03 DDP's construction stopped the trace.
    real = torchrun_peaks(TORCHRUN_SCRIPT, ["--ddp"], 2)
    for rank in range(2):
        argv = ["run", "--device", "cpu", "--nproc-per-node", "2", "--rank", str(rank), "--steps", "3",
                "--format", "json", TORCHRUN_SCRIPT, "--ddp"]
        assert metamem.cli.main(argv) == 0
        traced = max(json.loads(capsys.readouterr().out)["predicted"]["step_peaks"])
        assert min(real[rank]) == traced and all(peak >= traced for peak in real[rank]), (rank, real[rank], traced)
    argv = ["run", "--nproc-per-node", "8", "--rank", "3", "--format", "json", TORCHRUN_SCRIPT, "--ddp"]
    assert metamem.cli.main(argv) == 0  # on fake cuda, NCCL's group is metamem's
    assert json.loads(capsys.readouterr().out)["run"]["job"] == {"world_size": 8, "rank": 3, "nproc_per_node": 8}


def test_a_rank_of_a_job_on_many_gpus(capsys):
    # Rank 13 of two nodes of eight: LOCAL_RANK 5, whose GPU the script
    # takes; NCCL's group is metamem's.
    argv = ["run", "--nproc-per-node", "8", "--nnodes", "2", "--rank", "13", TORCHRUN_SCRIPT]
    assert metamem.cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "as rank 13 of 16 (2 nodes of 8), torchrun's environment" in printed
    assert "ended by itself after 1 optimizer step" in printed and "values read" not in printed
    for flags, error in ((["--rank", "1"], "give --nproc-per-node"),
                         (["--nproc-per-node", "8", "--rank", "8"], r"--rank must be in [0, 8)"),
                         (["--nproc-per-node", "0"], "must be positive")):
        assert metamem.cli.main(["run", *flags, TORCHRUN_SCRIPT]) == 2
        assert error in capsys.readouterr().err
