// metamem: will one training step fit, and how could it use less memory?
#include <torch/version.h>

#include <algorithm>
#include <iostream>

#include "examples/cli/Commands.h"
#include "examples/cli/Flags.h"
#include "memonger/LiveRange.h"
#include "meta/MetaMode.h"

namespace {

constexpr const char* kUsage =
    "usage: metamem profile --model NAME|FILE.pt --batch N --device cpu|cuda [--gpu H100-80GB|A100-80GB|L4|...]\n"
    "                       [--seq L] [--image S]\n"
    "                       [--input 32x3x224x224[:f32|:i64] ...] [--loss sum|cross_entropy:C]\n"
    "                       [--layers N] [--width N] [--heads N] [--vocab N] [--kv-heads N] [--ffn N]\n"
    "                       [--optimizer none|sgd|momentum|adam|adamw] [--optimizer-impl libtorch|for-loop]\n"
    "                       [--dtype f32|f16|bf16]\n"
    "                       [--table summary|nodes|modules] [--depth N]\n"
    "                       [--format table|csv|json] [--snapshot FILE.pickle] [--achieved]\n"
    "                       [--allocator-events FILE.txt]\n"
    "                       [--alloc-conf PYTORCH_ALLOC_CONF] [--cuda-context SIZE] [--nccl-buffers SIZE]\n"
    "                       [--steps N] [--grad-accum K]\n"
    "                       [--zero-grad set_to_none|zero|none] [--main-grads param|fp32] [--amp bf16|f16]\n"
    "                       [--attention math|flash] [--selective-recompute]\n"
    "                       [--tp N [--sequence-parallel]] [--dp N [--zero 0|1|2|3] [--rank R]]\n"
    "                       [--fsdp full|hybrid [--gpus-per-node N]] [--forward-prefetch]\n"
    "                       [--pp N [--stage S] [--microbatches M] [--schedule 1f1b|gpipe]]\n"
    "                       [--policy 0-3[1-2],5[;keep=aten::addmm]] [--html FILE.html]\n"
    "       metamem profile|fit|checkpoint --hf TYPE|ARCHITECTURE|CONFIG.json [--hf-set KEY=VALUE ...] | --timm NAME\n"
    "                       | --torchtitan 8B|70B|405B|debugmodel [--tp T] [--dp D] [--pp P [--microbatches N]]\n"
    "                         [--rank R] [--recompute ...]\n"
    "                       [--batch N] [--seq L] [--dtype f32|bf16|f16] [--checkpointing] [--gpu NAME] ...\n"
    "                       [--dp N [--fsdp full|hybrid]] [--tp T] [--pp P [--microbatches N]] [--rank R]\n"
    "                       [fit: --search --gpus N [--jobs J|--ray ADDR]]\n"
    "                       [checkpoint --hf: --budget 16GiB [--solver none|layers|selective|auto] [--pareto]\n"
    "                        (with --pp, a plan for each stage)]\n"
    "                       [--table ...] [--depth N] [--html FILE.html] [--snapshot ...] [--allocator-events ...]\n"
    "                       (the Python engine: metamem profile --hf llama --help lists its flags)\n"
    "       metamem run [--device cpu|cuda] [--gpu NAME] [--steps K] [--values error|placeholder]\n"
    "                       [--table ...] [--format table|csv|json] [--html FILE.html] ... SCRIPT [ARGS...]\n"
    "                       [--budget 16GiB [--solver none|layers|selective|auto] [--pareto]: the blocks to recompute]\n"
    "                       (a training script, unchanged, stopped after K optimizer steps; the Python engine)\n"
    "       metamem fit --model NAME [--memory 80GiB (default: the --gpu's)] [model flags as above]\n"
    "                       [--max-batch N] [--checkpoint none|uniform|chen|rotor|selective|auto]\n"
    "                       [--search --gpus N]\n"
    "                       [--format table|json]\n"
    "       metamem checkpoint --model NAME --budget 16GiB [model flags as above]\n"
    "                       [--solver none|uniform|chen|rotor|selective|auto] [--pareto] [--achieved]\n"
    "                       [--format table|json]\n"
    "       metamem plan FILE.csv [--algo greedy|dp|bestfit|exact|auto] [--alignment N]\n"
    "                       [--capacity 1MiB] [--time-limit 10s] [--output PLAN.csv]\n"
    "                       [--format table|json]\n"
    "       metamem --version | --help | COMMAND --help\n"
    "profile and checkpoint also take --html FILE.html: the report as one self-contained page.\n";

bool asks_for_help(const std::string& arg) { return arg == "--help" || arg == "-h" || arg == "help"; }

int run(const std::vector<std::string>& args) {
  using namespace metamem::cli;
  if (args.empty()) throw UsageError("missing command");
  if (runs_on_python_engine(args)) run_python_engine(args);
  if (asks_for_help(args[0]) || std::any_of(args.begin() + 1, args.end(), [](const std::string& a) {
        return a == "--help" || a == "-h";
      })) {
    std::cout << kUsage;
    return 0;
  }
  if (args[0] == "--version") {
    std::cout << "metamem " << METAMEM_VERSION << " (libtorch " << TORCH_VERSION << ")\n";
    return 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "profile") return profile_command(rest);
  if (args[0] == "plan") return plan_command(rest);
  if (args[0] == "fit") return fit_command(rest);
  if (args[0] == "checkpoint") return checkpoint_command(rest);
  throw UsageError("unknown command '" + args[0] + "'");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const metamem::cli::UsageError& e) {
    std::cerr << "metamem: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::invalid_argument& e) {  // bad model sizes
    std::cerr << "metamem: " << e.what() << "\n";
    return 2;
  } catch (const memonger::InputError& e) {  // bad ranges file
    std::cerr << "metamem: " << e.what() << "\n";
    return 2;
  } catch (const c10::NotImplementedError& e) {  // an op without a meta kernel
    std::cerr << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::cerr << "metamem: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "metamem: " << e.what() << "\n";
    return 1;
  }
}
