"""Property-based tests (Hypothesis) of every parser metamem reads user
input with, and of trace()'s arguments (issue 45): any input ends in a value
or in the parser's own error naming what was wrong; never a crash, a hang,
another exception, or a process left changed. Counts of inputs are fixed
(max_examples), so a run is the same on every machine (derandomize)."""

import json
import os
import subprocess

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metamem
from metamem import _metamem, hf
from metamem.cli import failure

METAMEM = os.environ.get("METAMEM_BIN")  # the C++ command; ctest sets it


def metamem_command(*args):
    assert METAMEM, "METAMEM_BIN must name the built metamem command (ctest sets it)"
    return subprocess.run([METAMEM, *args], capture_output=True, text=True, timeout=120)


def examples(n):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# --- memory sizes (--memory, --capacity, --budget, --cuda-context) -------------

UNITS = {"TiB": 2**40, "GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "TB": 1e12, "GB": 1e9, "MB": 1e6, "KB": 1e3,
         "B": 1, "": 1}


@examples(3000)
@given(st.one_of(st.text(max_size=24),
                 st.builds(lambda number, unit: f"{number}{unit}",
                           st.one_of(st.integers(-10, 2**70), st.floats(allow_nan=True, allow_infinity=True)),
                           st.sampled_from(sorted(UNITS) + ["gib", "kb", "b ", " GiB", "PiB"]))))
def test_a_memory_size_parses_or_names_its_flag(text):
    try:
        value = _metamem.parse_memory(text, "--memory")
    except ValueError as error:
        assert str(error).startswith("--memory expects a size such as 80GiB or 40GB, got '")
    else:
        assert 0 <= value < 2**63


@examples(1000)
@given(st.integers(1, 2**50), st.sampled_from(sorted(UNITS)))
def test_a_memory_size_counts_its_unit(number, unit):
    expected = float(number) * UNITS[unit]  # as the parser computes it, in doubles
    if expected >= 9.2e18:
        with pytest.raises(ValueError, match="expects a size"):
            _metamem.parse_memory(f"{number}{unit}", "--memory")
    else:
        assert _metamem.parse_memory(f"{number}{unit}", "--memory") == int(expected)


# --- PYTORCH_ALLOC_CONF --------------------------------------------------------

ALLOC_KEYS = ["expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb",
              "roundup_power2_divisions", "garbage_collection_threshold", "per_process_memory_fraction",
              "backend", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
              "pinned_num_register_threads", "bogus"]
ALLOC_VALUES = st.one_of(st.text(max_size=8), st.integers(-3, 2**64).map(str),
                         st.floats(allow_nan=True).map(str),
                         st.sampled_from(["True", "False", "native", "cudaMallocAsync", "[1,2]", "[256:1,>:2]",
                                          "[", "]", "[:]", "0.5", "1"]))


@examples(300)
@given(st.one_of(st.text(max_size=40),
                 st.lists(st.tuples(st.sampled_from(ALLOC_KEYS), ALLOC_VALUES), max_size=4).map(
                     lambda items: ",".join(f"{key}:{value}" for key, value in items))))
def test_an_allocator_setting_traces_or_names_itself(text):
    try:
        with metamem.trace(device="cuda", alloc_conf=text):
            torch.empty(1024, device="cuda")
    except ValueError as error:
        assert str(error).startswith("alloc_conf: ")
    except torch.OutOfMemoryError:  # a memory fraction too small for 4 KiB
        pass
    assert torch.randn(2).device.type == "cpu"


# --- trace()'s arguments ------------------------------------------------------

@examples(200)
@given(device=st.sampled_from(["cpu", "cuda", "cuda:0", "tpu", "", None, 0]),
       gpu=st.sampled_from(["H100-80GB", "L4", "T4", "h100", "", None]),
       values=st.sampled_from(["error", "placeholder", "zeros", None]),
       world_size=st.one_of(st.none(), st.integers(-2, 2**21), st.sampled_from([True, 2.0, "4"])),
       rank=st.one_of(st.integers(-2, 2**21), st.sampled_from([None, 1.5])))
def test_trace_arguments_trace_or_are_refused_before_anything_changes(device, gpu, values, world_size, rank):
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    try:
        with metamem.trace(device=device, gpu=gpu, values=values, world_size=world_size, rank=rank) as t:
            x = torch.randn(4, 4, device=device, requires_grad=True)
            (x * 2).sum().backward()
        assert t.peak_bytes > 0
    except (ValueError, TypeError) as error:
        assert str(error)
    assert torch.get_default_dtype() == dtype and torch.is_grad_enabled() == grad
    assert not torch.distributed.is_initialized()
    assert torch.randn(2).device.type == "cpu"


# --- config.json (--hf FILE) --------------------------------------------------

JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-2**65, 2**65), st.floats(),
                                     st.text(max_size=6)),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                     max_size=3),
                           max_leaves=6)
CONFIG_KEYS = ["num_hidden_layers", "n_layer", "hidden_size", "n_embd", "vocab_size", "num_attention_heads",
               "n_head", "max_position_embeddings", "intermediate_size", "architectures", "torch_dtype", "x"]


@examples(300)
@given(st.one_of(
    st.text(max_size=30),
    st.builds(json.dumps, JSON_VALUES),
    st.builds(lambda model_type, items: json.dumps({"model_type": model_type, **items}),
              st.one_of(st.sampled_from(["gpt2", "llama", "bert", "t5", "vit", "nope"]), JSON_VALUES),
              st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON_VALUES, max_size=4))))
def test_a_config_file_builds_or_is_bad_input(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("config") / "config.json"
    path.write_text(text)
    try:
        hf.config(str(path))
    except Exception as error:  # the CLI's verdict: bad input, one line, exit 2
        status, line = failure(error)
        assert status == 2, line


# --- range CSV and --policy, read by the C++ command ---------------------------

CSV_FIELDS = st.one_of(st.integers(-2, 2**63 - 1).map(str), st.integers(0, 64).map(str),
                       st.sampled_from(["", " ", "x", "1.5", "-0", "0x10", "true", "9" * 30]))


@examples(150)
@given(header=st.sampled_from(["", "id,first,last,bytes\n", "id,lower,upper,size\n", "id,first,last,bytes,pinned\n",
                               "a,b\n"]),
       rows=st.lists(st.lists(CSV_FIELDS, min_size=0, max_size=6).map(",".join), max_size=12))
def test_a_range_file_plans_or_exits_2_naming_it(tmp_path_factory, header, rows):
    path = tmp_path_factory.mktemp("ranges") / "ranges.csv"
    path.write_text(header + "\n".join(rows))
    run = metamem_command("plan", str(path), "--time-limit", "200ms")
    assert run.returncode in (0, 2), run.stderr
    if run.returncode == 2:
        assert run.stderr.startswith("metamem: ") and run.stderr.count("\n") == 1, run.stderr


@examples(40)
@given(st.one_of(st.text(alphabet="0123456789-[],;=keap:tn ", max_size=16),
                 st.builds(lambda a, b, keep: f"{a}-{b}" + (f";keep={keep}" if keep else ""),
                           st.integers(-1, 13), st.integers(-1, 13),
                           st.sampled_from(["", "aten::addmm", "aten::nope", "x"]))))
def test_a_checkpoint_policy_traces_or_exits_2_naming_it(policy):
    run = metamem_command("profile", "--model", "gpt2", "--batch", "1", "--seq", "8", "--layers", "2", "--width", "64",
                          "--heads", "2", "--vocab", "128", "--device", "cpu", "--policy", policy)
    assert run.returncode in (0, 2), run.stderr
    if run.returncode == 2:
        assert "checkpoint" in run.stderr and run.stderr.count("\n") == 1, run.stderr
