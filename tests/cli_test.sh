#!/usr/bin/env bash
# Exit codes and output of the metamem CLI.
set -u
metamem=$1
models=$2  # TorchScript files made by script_models.py
failures=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

expect() {  # expect CODE PATTERN ARGS...
  local code=$1 pattern=$2
  shift 2
  local out rc
  out=$("$metamem" "$@" 2>&1)
  rc=$?
  if [[ $rc -ne $code || ! $out =~ $pattern ]]; then
    echo "FAIL: metamem $* -> exit $rc (want $code), output: $out"
    failures=$((failures + 1))
  fi
}

expect 2 "unknown model 'nope'" profile --model nope --batch 2 --device cpu
expect 2 "batch must be positive" profile --model mlp --batch 0 --device cpu
expect 2 "batch must be positive" profile --model mlp --batch -3 --device cpu
expect 2 "expects an integer" profile --model mlp --batch 2x --device cpu
# Sizes whose tensors' bytes overflow int64, and counts a trace would never finish, are named.
expect 2 "batch 9223372036854775807 x seq 1024 x vocab 50257: a tensor of more than 2\\^60 elements" profile --model gpt2 --batch 9223372036854775807 --device cpu
expect 2 "batch 2 x 64 x image 4294967296 x image 4294967296" profile --model resnet18 --batch 2 --image 4294967296 --device cpu
expect 2 "layers must be at most 10000, got 9223372036854775807" profile --model gpt2 --batch 1 --layers 9223372036854775807 --device cpu
expect 2 "tensor-parallel ranks must be at most 1000" profile --model gpt2 --batch 1 --tp 4096 --heads 4096 --width 4096 --device cpu
expect 0 "predicted peak" profile --model mlp --batch 2 --device cpu --table modules --depth 9223372036854775807
expect 2 "unknown flag '--bogus'" profile --model mlp --bogus
expect 2 "needs a value" profile --model mlp --batch
expect 2 "--device must be cpu\\|cuda" profile --model mlp --batch 2 --device tpu
expect 2 "--format must be table\\|csv\\|json" profile --model mlp --batch 2 --format xml
expect 2 "unknown command" plot
expect 2 "heads" profile --model gpt2 --batch 1 --width 65 --heads 4
expect 0 '"peak_bytes": [0-9]+' profile --model mlp --batch 4 --device cpu --achieved --format json
expect 0 "predicted peak" profile --model resnet18 --batch 2 --image 32 --device cuda

# Estimator flags and reports.
expect 2 "unknown optimizer 'lion'" profile --model mlp --batch 2 --optimizer lion
expect 2 "unknown dtype 'f64'" profile --model mlp --batch 2 --dtype f64
expect 2 "--achieved needs --device cpu and --dtype f32" profile --model mlp --dtype bf16 --device cpu --achieved
expect 2 "--depth must be at least 1" profile --model mlp --table modules --depth 0
expect 2 "--memory expects a size" fit --model mlp --memory 80XB
expect 2 "--memory expects a size" fit --model mlp --memory lots
expect 2 "fit --device cpu needs --memory" fit --model mlp --device cpu
expect 2 "unknown GPU 'V100'; known: H100-80GB" profile --model mlp --gpu V100
expect 0 "largest batch that fits" fit --model mlp --gpu T4 --max-batch 64
expect 2 "--alloc-conf: roundup_power2_divisions must be a power of 2" profile --model mlp \
  --alloc-conf roundup_power2_divisions:3
expect 2 "--alloc-conf: backend:cudaMallocAsync is CUDA.s own pool" profile --model mlp \
  --alloc-conf backend:cudaMallocAsync
expect 1 "CUDA out of memory" profile --model mlp --alloc-conf per_process_memory_fraction:0.000001
expect 0 "max reserved .* expandable_segments:True" profile --model mlp --alloc-conf expandable_segments:True
PYTORCH_ALLOC_CONF=max_split_size_mb:64 expect 0 "max reserved .* max_split_size_mb:64" profile --model mlp
PYTORCH_CUDA_ALLOC_CONF=garbage_collection_threshold:2 expect 2 "garbage_collection_threshold" profile --model mlp
expect 0 "largest batch that fits" fit --model resnet18 --image 64 --memory 1GiB

# What the GPU holds beside the allocator (docs/gpu-memory.md).
expect 0 "GPU T4 .*CUDA context +253.00 MiB +estimate: 40.00 MiB stack \\(40 SMs × 1024 threads × 1 KiB\\)" \
  profile --model mlp --gpu T4
expect 0 "NCCL buffers +18.38 MiB +estimate: 1 communicator × 2 ring channels" profile --model mlp --gpu T4 --dp 2
expect 2 "200.00 MiB of T4 leaves nothing to the CUDA caching allocator beside CUDA context 253.00 MiB" \
  fit --model mlp --gpu T4 --memory 200MiB
expect 2 "--cuda-context expects a size" fit --model mlp --cuda-context lots
if ! "$metamem" fit --model gpt2 --seq 256 --layers 2 --width 256 --heads 4 --vocab 1000 --memory 2GiB --dp 2 --tp 2 \
  --cuda-context 300MiB --format json |
  python3 -c '
import json, sys
d = json.load(sys.stdin)
g = d["gpu_memory"]
# 2 GiB less the given context and two communicators of 32 H100 ring channels of 9,633,792 B.
assert [u["what"] for u in g["beside_allocator"]] == ["CUDA context", "NCCL buffers"], g
assert g["allocator_bytes"] == 2 * 2**30 - 300 * 2**20 - 2 * 32 * 9633792, g
assert 0 < d["predicted_bytes"] <= g["allocator_bytes"] and g["headroom_bytes"] >= 0, d
'
then echo "FAIL: fit's GPU memory JSON"; failures=$((failures + 1)); fi
expect 0 '"peak_phase": "(forward|backward|optimizer)"' profile --model mlp --batch 2 --optimizer adam --format json
expect 0 "^name,op,module,phase,fwd_flops" profile --model resnet18 --batch 2 --image 32 --table modules --format csv
expect 0 "ResNet.layer1" profile --model resnet18 --batch 2 --image 32 --table modules --depth 2

# Steady state: several steps, zero_grad modes, micro-batches, main gradients.
expect 2 "--steps must be between 1 and 1000" profile --model mlp --steps 0
expect 2 "--grad-accum must be between 1 and 1000" profile --model mlp --grad-accum 0
expect 2 "--zero-grad must be set_to_none\\|zero\\|none" profile --model mlp --zero-grad sometimes
expect 2 "--main-grads fp32 is for low-precision parameters" profile --model mlp --main-grads fp32
expect 0 '"step_peaks": \[' profile --model mlp --batch 2 --steps 3 --optimizer adam --format json
expect 0 "first step peak" profile --model mlp --batch 2 --optimizer momentum --zero-grad zero
expect 0 "18.0 bytes per parameter" profile --model mlp --batch 2 --dtype bf16 --optimizer adam --main-grads fp32
json=$("$metamem" profile --model mlp --batch 4 --device cpu --steps 3 --grad-accum 2 --optimizer adamw --achieved --format json)
if ! python3 - <<PY
import json
d = json.loads("""$json""")
p = d["predicted"]
assert len(p["step_peaks"]) == 3 and p["peak_bytes"] == p["step_peaks"][-1], p["step_peaks"]
assert p["first_step_peak_bytes"] == p["step_peaks"][0]
assert d["achieved"]["step_peaks"] == p["step_peaks"], (d["achieved"], p["step_peaks"])
assert d["steps"] == 3 and d["grad_accum"] == 2 and d["zero_grad"] == "set_to_none"
PY
then echo "FAIL: steady-state JSON"; failures=$((failures + 1)); fi

# Checkpointing: the plan fits, the re-trace agrees, the real CPU run too.
expect 2 "checkpoint needs --budget" checkpoint --model gpt2
expect 2 "--budget expects a size" checkpoint --model gpt2 --budget lots
expect 2 "--solver must be none\\|uniform\\|chen\\|rotor\\|selective\\|auto" checkpoint --model gpt2 --budget 1GiB --solver magic
expect 2 "outside units 0-9 \\(the model's chain: 0 conv1, 1 bn1\\+relu\\+maxpool, 2 layer1.0" \
  profile --model "$models/resnet18.pt" --input 2x3x64x64 --device cpu --policy 0-12
expect 1 "the least memory any policy reaches is [0-9.]+ [KMG]iB \\([0-9]+ B\\)" checkpoint --model gpt2 --batch 2 --seq 64 --budget 1MiB
json=$("$metamem" checkpoint --model gpt2 --batch 4 --seq 64 --layers 4 --width 64 --heads 4 --vocab 100 \
  --device cpu --budget 6MiB --achieved --pareto --format json)
if ! python3 - <<PY
import json
d = json.loads("""$json""")
assert d["peak_bytes"] <= d["budget_bytes"] < d["unchecked_peak_bytes"], d
assert d["retraced_peak_bytes"] == d["peak_bytes"] == d["achieved"]["peak_bytes"], d
assert d["recompute_flops"] > 0 and 0 < d["overhead"] < 1 and d["policy"], d
assert d["pareto"] and all(p["peak_bytes"] <= p["budget_bytes"] for p in d["pareto"]), d["pareto"]
PY
then echo "FAIL: checkpoint JSON"; failures=$((failures + 1)); fi
# A TorchScript file's chain (MobileNet V2's inverted residuals), checkpointed alike.
json=$("$metamem" checkpoint --model "$models/mobilenet_v2.pt" --input 4x3x64x64 --loss cross_entropy:1000 \
  --device cpu --budget 40MiB --solver chen --achieved --format json)
if ! python3 - <<PY
import json
d = json.loads("""$json""")
assert d["peak_bytes"] <= d["budget_bytes"] < d["unchecked_peak_bytes"], d
assert d["retraced_peak_bytes"] == d["peak_bytes"] == d["achieved"]["peak_bytes"], d
PY
then echo "FAIL: TorchScript checkpoint JSON"; failures=$((failures + 1)); fi
expect 0 "with checkpointing \\([a-z]+\\): units" fit --model gpt2 --seq 256 --layers 4 --memory 2GiB --checkpoint auto
# Without checkpointing, batch 15's live bytes fit and the allocator's reserved do not; a plan must recompute.
expect 0 "largest batch that fits in 256.00 MiB: 15 .*with checkpointing" fit --model gpt2 --seq 256 --layers 4 \
  --width 256 --heads 4 --vocab 1000 --optimizer adam --tp 2 --sequence-parallel --dp 2 --zero 2 --memory 256MiB \
  --cuda-context 0 --nccl-buffers 0 --checkpoint auto --max-batch 15

# A memory-viz snapshot: plain pickle, no GLOBAL or REDUCE, with segments and traces.
"$metamem" profile --model resnet18 --batch 2 --image 32 --snapshot "$dir/r18.pickle" >/dev/null
if ! python3 - "$dir/r18.pickle" <<'PY'
import pickle, pickletools, sys
data = open(sys.argv[1], "rb").read()
bad = {op.name for op, _, _ in pickletools.genops(data)} & {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ"}
snap = pickle.loads(data)
assert not bad, bad
assert snap["segments"] and snap["device_traces"][0], "empty snapshot"
assert {"action", "addr", "size", "stream", "time_us", "frames"} <= set(snap["device_traces"][0][0])
PY
then echo "FAIL: snapshot does not load as a plain pickle"; failures=$((failures + 1)); fi
# With expandable segments, torch's snapshot has a segment per mapped range of the growing address space.
"$metamem" profile --model resnet18 --batch 2 --image 32 --alloc-conf expandable_segments:True \
  --snapshot "$dir/r18-expandable.pickle" >/dev/null
if ! python3 - "$dir/r18-expandable.pickle" <<'PY'
import pickle, sys
segments = pickle.load(open(sys.argv[1], "rb"))["segments"]
assert segments and all(s["is_expandable"] for s in segments), segments
assert sum(b["size"] for s in segments for b in s["blocks"]) == sum(s["total_size"] for s in segments)
PY
then echo "FAIL: expandable snapshot"; failures=$((failures + 1)); fi

# TorchScript models.
expect 0 "ResNet.layer1" profile --model "$models/resnet18.pt" --input 2x3x64x64 --loss cross_entropy:1000 --table modules --depth 2
expect 0 '"batch": 2' profile --model "$models/resnet18.pt" --input 2x3x64x64 --device cuda --format json
expect 2 "is not a TorchScript file" profile --model "$dir/golden.csv.pt" --input 2x3x64x64
expect 2 "the inputs do not match the model's forward" profile --model "$models/resnet18.pt" --input 2x3x64x64 --input 2x3x64x64
expect 2 "input type \\(Long\\) and weight type \\(Float\\)" profile --model "$models/resnet18.pt" --input 2x3x64x64:i64
expect 2 "needs --input" profile --model "$models/resnet18.pt"
expect 2 "cross_entropy:10 needs an output of shape \\[batch, 10\\] or \\[batch, 10, ...\\], got \\[2, 1000\\]" \
  profile --model "$models/resnet18.pt" --input 2x3x64x64 --loss cross_entropy:10
expect 2 "--dtype is for zoo models" profile --model "$models/resnet18.pt" --input 2x3x64x64 --dtype bf16
expect 2 "--input is for TorchScript models" profile --model mlp --input 2x3
# A shape flag the model does not take was ignored: the answer was the default model's.
expect 2 "--width is for the zoo's gpt2 and llama, not mlp" profile --model mlp --batch 2 --width 64
expect 2 "--seq is for the zoo's gpt2 and llama, not resnet50" fit --model resnet50 --seq 128
expect 2 "--kv-heads is for the zoo's llama, not gpt2" checkpoint --model gpt2 --kv-heads 4 --budget 1GiB
expect 2 "--image is for the zoo's resnet18 and resnet50: a TorchScript model's shapes are its --input" \
  profile --model "$models/resnet18.pt" --input 2x3x64x64 --image 32
expect 1 "no meta kernel for aten::_unique2" profile --model "$models/unsupported_op.pt" --input 16
expect 0 "achieved peak \(real CPU\).*\(\+0 B\)" profile --model mlp --batch 2 --device cpu --amp f16 --achieved --optimizer adam
expect 2 "--amp must be none\\|bf16\\|f16" profile --model mlp --batch 2 --amp f8
expect 0 "autocast f16" profile --model mlp --batch 2 --device cuda --amp f16
expect 0 "rank of 4 data-parallel, ZeRO stage 3" profile --model mlp --batch 2 --dp 4 --zero 3 --optimizer adam
expect 2 "give --fsdp or --zero, not both" profile --model mlp --batch 2 --dp 4 --zero 2 --fsdp full
expect 2 "--fsdp hybrid needs --dp to be a multiple of --gpus-per-node" profile --model mlp --batch 2 --dp 12 --fsdp hybrid
expect 0 "optimizer adamw \\(for-loop\\)" profile --model mlp --batch 2 --optimizer adamw --optimizer-impl for-loop
expect 2 "--optimizer-impl" profile --model mlp --batch 2 --optimizer adam --optimizer-impl foreach
expect 2 "--forward-prefetch is for ZeRO stage 3" profile --model mlp --batch 2 --dp 4 --zero 2 --forward-prefetch
expect 2 "--zero must be 0, 1, 2 or 3" profile --model mlp --batch 2 --dp 4 --zero 4
expect 2 "--zero needs --dp 2 or more" profile --model mlp --batch 2 --zero 1
expect 2 "--rank must be between 0 and --dp minus 1" profile --model mlp --batch 2 --dp 2 --rank 2
expect 0 '"communication_bytes": [1-9]' profile --model mlp --batch 2 --dp 2 --format json
expect 0 "rank of 4 data-parallel, ZeRO stage 2" profile --model mlp --batch 2 --dp 4 --zero 2 --optimizer adam
small_llama=(--batch 1 --seq 64 --layers 1 --width 64 --heads 4 --vocab 100)
expect 0 "layouts of gpt2 on 4 GPUs" fit --model gpt2 "${small_llama[@]}" --memory 64MiB --optimizer adam --search --gpus 4 \
  --cuda-context 0 --nccl-buffers 0
expect 2 "--search and --gpus N go together" fit --model gpt2 "${small_llama[@]}" --memory 64MiB --search
expect 2 "fit --search chooses --tp, --pp, --dp, --zero and recompute itself" fit --model gpt2 "${small_llama[@]}" --memory 64MiB --search --gpus 4 --pp 2
expect 2 "--jobs must be between 1 and 256" fit --model gpt2 "${small_llama[@]}" --memory 64MiB --search --gpus 4 --jobs 0
expect 2 "fit --search lays out gpt2 and llama" fit --model mlp --memory 64MiB --search --gpus 4
expect 2 "checkpoint chooses what to recompute itself" checkpoint --model gpt2 "${small_llama[@]}" --budget 1MiB --selective-recompute
expect 0 "stage 1 of 2 \\(gpipe\\)" profile --model llama --batch 1 --seq 64 --layers 2 --width 64 --heads 4 --vocab 100 --pp 2 --stage 1 --microbatches 4 --schedule gpipe
expect 0 "error \+0.0000%" profile --model gpt2 --batch 1 --seq 64 --layers 4 --width 64 --heads 4 --vocab 100 --device cpu --pp 2 --microbatches 3 --tp 2 --sequence-parallel --achieved
expect 2 "layers \\(1\\) must be a multiple of the pipeline stages \\(2\\)" profile --model gpt2 "${small_llama[@]}" --pp 2
expect 2 "--stage must be between 0 and --pp minus 1" profile --model gpt2 "${small_llama[@]}" --pp 2 --stage 2
expect 2 "--microbatches is for --pp" profile --model gpt2 "${small_llama[@]}" --microbatches 4
expect 2 "pipeline parallelism runs with ZeRO stage 0 or 1" profile --model gpt2 --batch 1 --seq 64 --layers 2 --width 64 --heads 4 --vocab 100 --pp 2 --dp 2 --zero 2
expect 2 "--schedule must be 1f1b\|gpipe" profile --model gpt2 "${small_llama[@]}" --schedule interleaved
expect 0 "ZeRO stage 3 \\(sharded over 8\\)" profile --model gpt2 "${small_llama[@]}" --dp 16 --fsdp hybrid
expect 0 '"shard_ranks": 4' profile --model gpt2 "${small_llama[@]}" --dp 4 --fsdp full --format json
expect 0 "ZeRO stage 3, forward prefetch" profile --model gpt2 "${small_llama[@]}" --dp 4 --fsdp full --forward-prefetch
expect 2 "flash attention is for gpt2 and llama" profile --model mlp --batch 2 --attention flash
expect 2 "--attention must be math\|flash" profile --model llama "${small_llama[@]}" --attention fused
expect 1 "FlashAttention-2 runs f16 and bf16 only" profile --model llama "${small_llama[@]}" --attention flash
expect 0 "predicted peak" profile --model llama "${small_llama[@]}" --attention flash --amp bf16
expect 0 "error \+0.0000%" profile --model gpt2 "${small_llama[@]}" --device cpu --attention flash --achieved
expect 0 "rank of 2 tensor-parallel with sequence parallelism" profile --model llama "${small_llama[@]}" --dtype bf16 --tp 2 --sequence-parallel
expect 0 '"tensor_parallel": 4' profile --model gpt2 "${small_llama[@]}" --tp 4 --dp 2 --format json
expect 0 "error \+0.0000%" profile --model gpt2 "${small_llama[@]}" --device cpu --tp 2 --sequence-parallel --selective-recompute --achieved
expect 2 "heads \(4\) must be a multiple of the tensor-parallel ranks \(3\)" profile --model gpt2 "${small_llama[@]}" --tp 3
expect 2 "tensor parallelism is for gpt2 and llama" profile --model mlp --batch 2 --tp 2
expect 2 "sequence parallelism needs tensor parallelism" profile --model gpt2 "${small_llama[@]}" --sequence-parallel
expect 2 "selective recompute is for gpt2 and llama with math attention" profile --model llama "${small_llama[@]}" --dtype bf16 --attention flash --selective-recompute
expect 2 "--amp with --sequence-parallel or --pp is not modelled" profile --model gpt2 "${small_llama[@]}" --tp 2 --sequence-parallel --amp bf16
expect 2 "--tp, --sequence-parallel, --selective-recompute and --pp are for the zoo" profile --model "$models/resnet18.pt" --input 2x3x64x64 --tp 2

# predicted == achieved for mlp, read from the JSON.
json=$("$metamem" profile --model mlp --batch 16 --device cpu --achieved --format json)
peaks=$(python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["predicted"]["peak_bytes"], d["achieved"]["peak_bytes"])' <<<"$json")
read -r p a <<<"$peaks"
if [[ "$p" != "$a" ]]; then echo "FAIL: mlp predicted $p != achieved $a"; failures=$((failures + 1)); fi

# metamem plan: Caffe2's golden case, then bad files.
printf 'id,first,last,bytes\n1,1,3,10\n2,3,4,1\n3,5,6,1\n4,5,7,10\n' >"$dir/golden.csv"
printf '1,0,1,8\n2,0,x,8\n' >"$dir/letter.csv"
printf '1,0,1,-8\n' >"$dir/negative.csv"
printf '1,4,1,8\n' >"$dir/backwards.csv"
printf '1,0,1,8\n1,2,3,8\n' >"$dir/duplicate.csv"
expect 0 '"planned_bytes": 11' plan "$dir/golden.csv" --algo dp --format json
expect 0 '"planned_bytes": 11' plan "$dir/golden.csv" --algo greedy --format json
expect 0 '"lower_bound_bytes": 11' plan "$dir/golden.csv" --format json
expect 0 "planned / lower bound = 1.0000" plan "$dir/golden.csv" --algo bestfit
expect 2 "line 2: last is not an integer: 'x'" plan "$dir/letter.csv"
expect 2 "line 1: negative bytes" plan "$dir/negative.csv"
expect 2 "line 1: last step before first step" plan "$dir/backwards.csv"
expect 2 "line 2: duplicate id 1" plan "$dir/duplicate.csv"
expect 2 "cannot open" plan "$dir/missing.csv"
expect 2 "--algo must be" plan "$dir/golden.csv" --algo magic
expect 2 "exactly one FILE.csv" plan
expect 2 "alignment must be at least 1" plan "$dir/golden.csv" --alignment 0

# MiniMalloc's layout (upper excluded), decided at a capacity, the plan written out.
printf 'id,lower,upper,size\n1,0,3,4\n2,3,9,4\n3,0,9,4\n4,9,21,4\n5,0,21,4\n' >"$dir/minimalloc.csv"
expect 0 "capacity 12 B \(12 B\): fits" plan "$dir/minimalloc.csv" --algo exact --capacity 12 --output "$dir/plan.csv"
if [[ $(head -1 "$dir/plan.csv") != "id,lower,upper,size,offset" || $(wc -l <"$dir/plan.csv") -ne 6 ]]; then
  echo "FAIL: plan.csv: $(cat "$dir/plan.csv")"
  failures=$((failures + 1))
fi
expect 1 "does not fit \(proven\)" plan "$dir/minimalloc.csv" --capacity 11
expect 0 '"optimal": true' plan "$dir/golden.csv" --algo exact --time-limit 500ms --format json
expect 2 "--time-limit expects a duration" plan "$dir/golden.csv" --time-limit soon
expect 2 "--capacity expects a size" plan "$dir/golden.csv" --capacity -5
printf 'id,lower,upper,size\n1,3,3,4\n' >"$dir/empty_life.csv"
expect 2 "line 2: upper must be above lower" plan "$dir/empty_life.csv"
# Input whose arithmetic would overflow, and files with nothing to plan.
printf '1,0,9223372036854775807,8\n' >"$dir/endless.csv"
printf '1,0,1,9223372036854775807\n2,0,1,9223372036854775807\n' >"$dir/huge.csv"
: >"$dir/nothing.csv"
expect 2 "last step is 2\^63-1" plan "$dir/endless.csv" --algo exact
expect 2 "add up to more than 2\^63-1" plan "$dir/huge.csv"
expect 2 "do not fit in 64 bits" plan "$dir/golden.csv" --alignment 9223372036854775807
expect 2 "has no ranges" plan "$dir/nothing.csv"
expect 2 "is a directory" plan "$dir"
expect 2 "--max-batch must be between 1 and" fit --model mlp --max-batch 9223372036854775807

echo "cli: $failures failed"
exit $((failures > 0))
