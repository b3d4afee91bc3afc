#!/usr/bin/env bash
# `pip install .` as a user runs it in an environment that has the pinned
# torch: the wheel's `metamem` command and Python module work from outside
# the source tree and answer as the build tree's do, byte for byte.
set -euo pipefail
python=$1        # the Python with the pinned torch
source=$2        # the source tree
work=$3          # kept between runs: the wheel's CMake build is incremental
built_cli=$4     # the build tree's metamem
built_python=$5  # the build tree's Python package folder
compiler=$6      # the build tree's C++ compiler

fail() { echo "FAIL: $*"; exit 1; }

rm -rf "$work/wheels" "$work/venv" "$work/elsewhere"
# The build tree's compiler by the same name (scikit-build-core would take
# Python's, x86_64-linux-gnu-g++), so that ccache, where installed, gives the
# wheel's build the objects the build tree compiled.
CXX=$compiler "$python" -m pip wheel -q --no-build-isolation --no-deps -w "$work/wheels" "$source" \
  --config-settings build-dir="$work/cmake"

# A fresh environment with torch in its site-packages, as pip leaves it. torch
# is linked from the project's environment instead of installed a second time
# (5 GB with its CUDA libraries); a .pth file lends it the rest (numpy, the
# CUDA libraries' packages).
"$python" -m venv "$work/venv"
venv_python=$work/venv/bin/python
site=$("$venv_python" -c "import sysconfig; print(sysconfig.get_path('platlib'))")
project_site=$("$python" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
ln -s "$project_site/torch" "$site/torch"
echo "$project_site" >"$site/zz_project_site.pth"
"$venv_python" -m pip install -q --no-deps "$work/wheels"/metamem-*.whl

# An empty folder: nothing of the source or build tree on Python's path.
mkdir -p "$work/elsewhere"
cd "$work/elsewhere"

installed_cli=$work/venv/bin/metamem
[[ $("$installed_cli" --version) == $("$built_cli" --version) ]] || fail "metamem --version differs"
profile=(profile --model gpt2 --layers 2 --batch 2 --seq 64 --device cuda --format json)
cmp <("$installed_cli" "${profile[@]}") <("$built_cli" "${profile[@]}") ||
  fail "the installed metamem's report differs from the build tree's"
"$installed_cli" profile --model nope 2>/dev/null && fail "an unknown model exits with 0"
# --hf runs the Python engine with the environment's own Python, beside the command.
"$installed_cli" profile --hf gpt2 --hf-set n_layer=2 --hf-set n_embd=64 --hf-set n_head=2 --hf-set vocab_size=256 \
  --batch 2 --seq 16 --device cpu --achieved | grep -q "predicted - achieved +0 B" ||
  fail "the installed metamem --hf is not exact on cpu"

step='
import torch, metamem
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
with metamem.trace(device="cuda", modules=[model]) as t:
    model(torch.randn(32, 64, device="cuda")).sum().backward()
print(t.peak_bytes, metamem.__file__)
'
read -r installed_peak installed_file < <("$venv_python" -c "$step")
read -r built_peak built_file < <(PYTHONPATH=$built_python "$python" -c "$step")
[[ $installed_file == "$site/metamem/__init__.py" ]] || fail "imported $installed_file, not the installed package"
[[ $built_file == "$built_python/metamem/__init__.py" ]] || fail "imported $built_file, not the build tree's package"
[[ $installed_peak == "$built_peak" ]] || fail "installed peak $installed_peak B, build tree's $built_peak B"

# The wheel asks for exactly the torch it was built against; the model
# libraries come only with the `models` extra.
"$venv_python" -c '
import importlib.metadata, torch
wanted = ["torch==" + torch.__version__.split("+")[0]]
requires = importlib.metadata.requires("metamem")
plain = [r for r in requires if "extra ==" not in r]
extra = sorted(r.split(";")[0].split("==")[0] for r in requires if r.endswith("extra == \"models\""))
assert plain == wanted, f"metamem requires {plain}, built against {wanted}"
assert extra == ["datasets", "diffusers", "einops", "spmd_types", "tensorboard", "timm", "torch_checkpointing",
                 "torchdata", "torchtitan", "transformers", "tyro", "wandb"], f"the models extra holds {extra}"
'
echo "pip install: the installed metamem command and module answer as the build tree's (peak $installed_peak B)"
