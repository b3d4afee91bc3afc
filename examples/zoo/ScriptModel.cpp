#include "examples/zoo/ScriptModel.h"

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/library.h>
#include <torch/nn/functional/loss.h>
#include <torch/script.h>

#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "examples/zoo/ParseInteger.h"
#include "meta/MetaMode.h"
#include "profiler/CpuMemoryCounter.h"
#include "profiler/Tracer.h"

namespace metamem {
namespace {

std::int64_t parse_positive(const std::string& text, const std::string& what) {
  const auto value = parse_integer(text);
  if (!value || *value <= 0)
    throw std::invalid_argument(what + ": '" + text + "' is not a positive integer");
  return *value;
}

// "TOP(ResNet)::forward", "layer1(Sequential)::forward", "0(BasicBlock)::forward"
// -> "ResNet.layer1.0"; frames of the same module (SELF) and of functions add nothing.
std::string module_path(const std::vector<std::string>& hierarchy) {
  std::string path;
  for (const std::string& frame : hierarchy) {
    const std::size_t open = frame.find('('), close = frame.find(')');
    if (open == std::string::npos || close == std::string::npos || open == 0) continue;
    std::string instance = frame.substr(0, open);
    if (instance == "TOP") instance = frame.substr(open + 1, close - open - 1);
    else if (instance == "SELF" || instance == "CALL_FUNCTION" || instance == "INSTANCE_NAME_UNKNOWN") continue;
    path += (path.empty() ? "" : ".") + instance;
  }
  return path;
}

// The forward graph with the model's calls of its own methods inlined (a
// torchvision model's forward calls self._forward_impl), so that its
// submodule calls show.
std::shared_ptr<torch::jit::Graph> forward_graph(const torch::jit::Module& module) {
  std::shared_ptr<torch::jit::Graph> graph = module.get_method("forward").graph()->copy();
  for (bool inlined = true; inlined;) {
    inlined = false;
    for (torch::jit::Node* node : graph->nodes()) {
      if (node->kind() != c10::prim::CallMethod || node->input(0) != graph->inputs()[0]) continue;
      torch::jit::Function& method = module.type()->getMethod(node->s(c10::attr::name));
      torch::jit::inlineCallTo(node, &torch::jit::toGraphFunction(method));
      inlined = true;
      break;
    }
  }
  return graph;
}

// A call `self.<child>.forward(x)` of one tensor to one tensor: its child's name, else none.
std::optional<std::string> child_called(const torch::jit::Graph& graph, const torch::jit::Node* node) {
  if (node->kind() != c10::prim::CallMethod || node->s(c10::attr::name) != "forward" || node->inputs().size() != 2 ||
      node->outputs().size() != 1 || node->input(1)->type()->kind() != c10::TypeKind::TensorType ||
      node->output()->type()->kind() != c10::TypeKind::TensorType)
    return std::nullopt;
  const torch::jit::Node* get = node->input(0)->node();
  if (get->kind() != c10::prim::GetAttr || get->input(0) != graph.inputs()[0]) return std::nullopt;
  return get->s(c10::attr::name);
}

// The model's chain: the longest run of child calls, each taking the last
// one's output, which nothing else takes, with nothing but attribute reads
// and constants between them (so that running them apart changes no
// order). Its calls, and the children's names.
struct ScriptChain {
  std::vector<torch::jit::Node*> calls;
  std::vector<std::string> children;
};

ScriptChain script_chain(torch::jit::Graph& graph) {
  ScriptChain best, run;
  for (torch::jit::Node* node : graph.nodes()) {
    const std::optional<std::string> child = child_called(graph, node);
    if (!child) {
      if (node->kind() != c10::prim::GetAttr && node->kind() != c10::prim::Constant) run = {};
      continue;
    }
    const bool continues = !run.calls.empty() && node->input(1) == run.calls.back()->output() &&
                           run.calls.back()->output()->uses().size() == 1;
    if (!continues) run = {};
    run.calls.push_back(node);
    run.children.push_back(*child);
    if (run.calls.size() > best.calls.size()) best = run;
  }
  return best;
}

// Whether `graph`'s whole computation is `chain`: its input through the
// chain's calls to its return (a Sequential's forward), so that the module
// can stand for its children.
bool all_chain(torch::jit::Graph& graph, const ScriptChain& chain) {
  if (chain.calls.empty() || graph.inputs().size() != 2 || graph.outputs().size() != 1 ||
      chain.calls.front()->input(1) != graph.inputs()[1] || chain.calls.back()->output() != graph.outputs()[0])
    return false;
  for (torch::jit::Node* node : graph.nodes())
    if (node->kind() != c10::prim::GetAttr && node->kind() != c10::prim::Constant &&
        std::find(chain.calls.begin(), chain.calls.end(), node) == chain.calls.end())
      return false;
  return true;
}

// The children a chain runs, by path from the model ("features.3"): a child
// that is a chain of its own children all through stands for them.
void add_children(const torch::jit::Module& module, const std::string& path, std::vector<std::string>& paths) {
  std::shared_ptr<torch::jit::Graph> graph = forward_graph(module);
  const ScriptChain chain = script_chain(*graph);
  if (path.empty() || !all_chain(*graph, chain)) {
    paths.push_back(path);
    return;
  }
  for (const std::string& name : chain.children)
    add_children(module.attr(name).toModule(), path + "." + name, paths);
}

// The submodule at `path` ("features.3") below `module`.
torch::jit::Module submodule(torch::jit::Module module, const std::string& path) {
  std::istringstream names(path);
  for (std::string name; std::getline(names, name, '.');) module = module.attr(name).toModule();
  return module;
}

// The chain a step is running, for metamem::script_chain (one step at a
// time runs on a thread).
struct ChainRun {
  std::vector<Unit> units;
  const CheckpointPolicy* policy = nullptr;
};
thread_local const ChainRun* running_chain = nullptr;

at::Tensor run_script_chain(const at::Tensor& x) {
  if (!running_chain) throw std::logic_error("metamem::script_chain runs only inside a TorchScript model's step");
  return run_chain(running_chain->units, x, *running_chain->policy);
}

TORCH_LIBRARY_FRAGMENT(metamem, m) {
  // A TorchScript model's chain of submodules, run under its step's policy:
  // composite, so that autograd sees the chain's own ops.
  m.def("script_chain(Tensor x) -> Tensor");
  m.impl("script_chain", c10::DispatchKey::CompositeImplicitAutograd, TORCH_FN(run_script_chain));
}

// `graph` with its chain's calls replaced by one call of metamem::script_chain.
void call_chain_as_one(torch::jit::Graph& graph, const ScriptChain& chain) {
  torch::jit::Node* last = chain.calls.back();
  torch::jit::WithInsertPoint here(last);
  torch::jit::Node* call = graph.insertNode(graph.create(c10::Symbol::fromQualString("metamem::script_chain"),
                                                         {chain.calls.front()->input(1)}, 1));
  call->output()->setType(last->output()->type());
  last->output()->replaceAllUsesWith(call->output());
  for (auto node = chain.calls.rbegin(); node != chain.calls.rend(); ++node) (*node)->destroy();
}

// The last line of an interpreter error: "RuntimeError: <what went wrong>".
std::string last_line(const std::string& message) {
  std::string line, last;
  std::istringstream lines(message);
  while (std::getline(lines, line))
    if (!line.empty()) last = line;
  return last;
}

// Each tensor constant of `block`'s nodes and of their blocks, replaced by
// what `replace` gives for it.
void replace_tensor_constants(torch::jit::Block* block,
                              const std::function<at::Tensor(const at::Tensor&)>& replace) {
  for (torch::jit::Node* node : block->nodes()) {
    for (torch::jit::Block* inner : node->blocks()) replace_tensor_constants(inner, replace);
    if (node->kind() == c10::prim::Constant && node->hasAttribute(c10::attr::value) &&
        node->kindOf(c10::attr::value) == torch::jit::AttributeKind::t)
      node->t_(c10::attr::value, replace(node->t(c10::attr::value)));
  }
}

using TensorReplacement = std::function<at::Tensor(const at::Tensor&, bool parameter)>;

// What `make` gives for a tensor, made once per tensor: one held twice (a
// tied weight, a parameter in nn.LSTM's _flat_weights) stays one.
TensorReplacement once_per_tensor(TensorReplacement make) {
  auto made = std::make_shared<std::unordered_map<const c10::TensorImpl*, at::Tensor>>();
  return [made, make = std::move(make)](const at::Tensor& t, bool parameter) {
    auto [entry, fresh] = made->try_emplace(t.unsafeGetTensorImpl());
    if (fresh) entry->second = make(t, parameter);
    return entry->second;
  };
}

// The tensors of `module`'s and its submodules' slots replaced by what
// `replace` gives for each (whether it is a parameter): their parameters
// and buffers where `parameters_and_buffers`, else the tensors of other
// attributes (nn.LSTM's _flat_weights, a list of its parameters).
void replace_slot_tensors(const torch::jit::Module& module, bool parameters_and_buffers,
                          const TensorReplacement& replace) {
  const c10::ClassTypePtr type = module.type();
  const c10::intrusive_ptr<c10::ivalue::Object>& object = module._ivalue();
  for (std::size_t i = 0; i < type->numAttributes(); ++i) {
    if ((type->is_parameter(i) || type->is_buffer(i)) != parameters_and_buffers) continue;
    const c10::IValue value = object->getSlot(i);
    if (value.isTensor() && value.toTensor().defined()) {
      object->setSlot(i, replace(value.toTensor(), type->is_parameter(i)));
    } else if (value.isList()) {  // a new list: a clone may share its lists with the module it copies
      c10::impl::GenericList list(value.toList().elementType());
      for (const c10::IValue& item : value.toListRef()) {
        const bool tensor = item.isTensor() && item.toTensor().defined();
        list.push_back(tensor ? c10::IValue(replace(item.toTensor(), false)) : item);
      }
      object->setSlot(i, c10::IValue(std::move(list)));
    }
  }
  for (const torch::jit::Module& child : module.children()) replace_slot_tensors(child, parameters_and_buffers, replace);
}

// Each tensor `module` and its submodules hold, replaced by what `make`
// gives for it, made once per tensor: first every module's parameters
// (leaves that need gradients) and buffers, then the tensors of other
// attributes.
void replace_module_tensors(const torch::jit::Module& module, TensorReplacement make) {
  const TensorReplacement replace = once_per_tensor(std::move(make));
  replace_slot_tensors(module, true, replace);
  replace_slot_tensors(module, false, replace);
}

// A file's tensor constants (its constants.pkl), on the host.
std::vector<at::Tensor> tensor_constants(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  std::vector<at::Tensor> constants;
  if (!reader.hasRecord("constants.pkl")) return constants;
  const c10::IValue table = torch::jit::readArchiveAndTensors("constants", "", "", std::nullopt, std::nullopt,
                                                              c10::Device(c10::kCPU), reader);
  for (const c10::IValue& constant : table.toTupleRef().elements())
    if (constant.isTensor()) constants.push_back(constant.toTensor());
  return constants;
}

// The file's module, its tensors on meta and its graphs' tensor constants
// on the host. torch.jit.trace keeps what a forward made from Python values
// as graph constants (each BatchNorm's `num_batches_tracked += 1` adds a
// tensor `1`); real torch holds them on the host for a CPU run, and a trace
// does too, with their values (each step's clone puts them on a fake GPU,
// as a load onto the GPU does). A file with one tensor constant at most is
// read onto meta, its weights never held, and the constant put back. With
// more, torch's loader pools a graph's constants by comparing their values,
// which meta tensors have none of: such a file is read onto the host, and
// its module's tensors moved to meta after.
torch::jit::Module load_onto_meta(const std::string& path) {
  const std::vector<at::Tensor> constants = tensor_constants(path);
  if (constants.size() > 1) {
    torch::jit::Module module = torch::jit::load(path, c10::Device(c10::kCPU));
    replace_module_tensors(module, [](const at::Tensor& t, bool) {
      return t.detach().to(c10::kMeta).requires_grad_(t.requires_grad());
    });
    return module;
  }
  torch::jit::Module module = torch::jit::load(path, c10::Device(c10::kMeta));
  for (torch::jit::Function* function : module._ivalue()->compilation_unit()->get_functions()) {
    auto* graph_function = torch::jit::tryToGraphFunction(*function);
    if (graph_function == nullptr) continue;
    replace_tensor_constants(graph_function->graph()->block(), [&](const at::Tensor& constant) {
      if (!constant.is_meta()) return constant;
      if (constants.empty()) throw std::invalid_argument("'" + path + "' has a tensor constant its constants table lacks");
      return constants.front();
    });
  }
  return module;
}

class ScriptStep final : public TrainingStep {
 public:
  ScriptStep(const torch::jit::Module& on_meta, const ScriptConfig& config)
      : policy_(config.checkpoint.value_or(CheckpointPolicy{})), loss_(config.loss) {
    if (meta_mode_active()) {
      {
        OutsideMetaMode outside;
        module_ = on_meta.clone();
      }
      adopt_tensors(module_);
      constants_onto_device(module_);
    } else {
      module_ = torch::jit::load(config.path);
      // All the process holds but the model's tensors: the loader's records,
      // and what an earlier load of a file left cached (a second load of
      // the same file keeps less of its own).
      host_only_ = CpuMemoryCounter::live_bytes() - storage_bytes(module_);
    }
    module_.train();
    if (config.checkpoint) {
      std::shared_ptr<torch::jit::Graph> graph = forward_graph(module_);
      const ScriptChain chain = script_chain(*graph);
      if (chain.calls.empty())
        throw std::invalid_argument("--policy: the model's forward calls no submodules one after the other "
                                    "(a chain of units to checkpoint)");
      const std::vector<std::vector<std::string>> units = units_of(chain);
      validate_against(units);
      for (const std::vector<std::string>& paths : units) {
        std::vector<torch::jit::Module> children;
        for (const std::string& path : paths) children.push_back(submodule(module_, path));
        chain_.units.push_back({{paths.front()}, [children](const at::Tensor& x) mutable {
                                  at::Tensor y = x;
                                  for (torch::jit::Module& child : children) y = child.forward({y}).toTensor();
                                  return y;
                                }});
      }
      chain_.policy = &policy_;
      call_chain_as_one(*graph, chain);
      chained_forward_ = std::make_unique<torch::jit::GraphFunction>("forward_chained", graph, nullptr);
    }
    for (const InputSpec& spec : config.inputs)
      inputs_.push_back(c10::isFloatingType(spec.dtype)
                            ? torch::randn(spec.sizes, torch::dtype(spec.dtype))
                            : torch::zeros(spec.sizes, torch::dtype(spec.dtype)));
    if (loss_.classes > 0 && !config.inputs.empty())
      targets_ = torch::zeros({config.inputs[0].sizes[0]}, torch::kLong);
  }

  std::int64_t host_only_bytes() const override { return host_only_; }

  std::vector<at::Tensor> parameters() override {
    std::vector<at::Tensor> params;
    for (const at::Tensor& p : module_.parameters()) params.push_back(p);
    return params;
  }

  at::Tensor forward_loss() override {
    Tracer::set_scope_provider([] { return module_path(torch::jit::currentModuleHierarchy()); });
    struct ClearProvider {
      ~ClearProvider() { Tracer::set_scope_provider(nullptr); }
    } clear;
    const at::Tensor out = output(run_forward());
    if (loss_.classes == 0) return out.sum();
    if (out.dim() < 2 || out.size(1) != loss_.classes)
      throw std::invalid_argument("cross_entropy:" + std::to_string(loss_.classes) +
                                  " needs an output of shape [batch, " + std::to_string(loss_.classes) +
                                  "] or [batch, " + std::to_string(loss_.classes) + ", ...], got " +
                                  c10::str(out.sizes()));
    if (out.dim() == 2) return torch::nn::functional::cross_entropy(out, targets_);
    // A class per element (segmentation): targets shaped like the output
    // less its class dimension, made in the step since only it knows them.
    std::vector<std::int64_t> sizes = out.sizes().vec();
    sizes.erase(sizes.begin() + 1);
    return torch::nn::functional::cross_entropy(out, torch::zeros(sizes, out.options().dtype(torch::kLong)));
  }

 private:
  c10::IValue run_forward() {
    std::vector<c10::IValue> args(inputs_.begin(), inputs_.end());
    try {
      if (!chained_forward_) return module_.forward(args);
      args.insert(args.begin(), module_._ivalue());
      running_chain = &chain_;
      struct Done {
        ~Done() { running_chain = nullptr; }
      } done;
      return (*chained_forward_)(std::move(args));
    } catch (const c10::NotImplementedError&) {
      throw;  // an op without a meta kernel, named
    } catch (const c10::Error& e) {  // the call itself: argument count or types
      throw std::invalid_argument("the inputs do not match the model's forward: " +
                                  last_line(e.what_without_backtrace()));
    } catch (const std::runtime_error& e) {  // an op inside forward rejected them
      throw std::invalid_argument("the model's forward failed on the given inputs: " +
                                  last_line(e.what()));
    }
  }

  // The tensor the loss reads: the output itself, a tuple's first tensor,
  // or a dict's "out" (torchvision's segmentation models), else its first.
  static at::Tensor output(const c10::IValue& value) {
    if (value.isTensor()) return value.toTensor();
    if (value.isTuple())
      for (const c10::IValue& element : value.toTupleRef().elements())
        if (element.isTensor()) return element.toTensor();
    if (value.isGenericDict()) {
      const c10::impl::GenericDict dict = value.toGenericDict();
      for (const auto& entry : dict)
        if (entry.key().isString() && entry.key().toStringRef() == "out" && entry.value().isTensor())
          return entry.value().toTensor();
      for (const auto& entry : dict)
        if (entry.value().isTensor()) return entry.value().toTensor();
    }
    throw std::invalid_argument(
        "the model's forward must return a tensor, a tuple starting with one or a dict of them");
  }

  // Each tensor the module holds becomes a MetaTensor on the fake device,
  // its buffer allocated in replace_module_tensors' order.
  static void adopt_tensors(const torch::jit::Module& module) {
    replace_module_tensors(module, [](const at::Tensor& t, bool parameter) {
      return parameter ? adopt_meta_tensor(t).requires_grad_(true) : adopt_meta_tensor(t);
    });
  }

  // A GPU run loads the file onto the GPU, its graphs' tensor constants
  // too, each once; a CPU run holds them on the host (load_onto_meta).
  // The clone's methods have graphs of their own.
  static void constants_onto_device(const torch::jit::Module& module) {
    if (fake_device().is_cpu()) return;
    const TensorReplacement to_device = once_per_tensor([](const at::Tensor& t, bool) { return t.to(fake_device()); });
    for (const torch::jit::Module& each : module.modules())
      for (const torch::jit::Method& method : each.get_methods())
        replace_tensor_constants(method.graph()->block(),
                                 [&](const at::Tensor& constant) { return to_device(constant, false); });
  }

  // Bytes of the parameters' and buffers' storages, each storage once.
  static std::int64_t storage_bytes(const torch::jit::Module& module) {
    std::unordered_set<const void*> seen;
    std::int64_t total = 0;
    auto add = [&](const at::Tensor& t) {
      const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      if (seen.insert(storage).second) total += static_cast<std::int64_t>(storage->nbytes());
    };
    for (const at::Tensor& p : module.parameters()) add(p);
    for (const at::Tensor& b : module.buffers()) add(b);
    return total;
  }

  // The chain's units, by path: each child with parameters (a Sequential
  // among them stands for its own chain), with the children without any
  // that follow it (an activation, a pooling: ReLU(inplace) gives back its
  // input, which a checkpointed segment cannot end on), those before the
  // first with it.
  std::vector<std::vector<std::string>> units_of(const ScriptChain& chain) const {
    std::vector<std::string> paths;
    for (const std::string& name : chain.children) add_children(module_.attr(name).toModule(), name, paths);
    std::vector<std::vector<std::string>> units;
    std::vector<std::string> leading;  // parameter-free children before the first with parameters
    for (const std::string& path : paths) {
      if (submodule(module_, path).parameters().size() > 0) {
        units.push_back(std::exchange(leading, {}));
        units.back().push_back(path);
      } else {
        (units.empty() ? leading : units.back()).push_back(path);
      }
    }
    if (units.empty()) units.push_back(std::move(leading));  // no parameters at all: one unit
    return units;
  }

  // Throws std::invalid_argument, naming the units, where the policy does not fit them.
  void validate_against(const std::vector<std::vector<std::string>>& units) const {
    try {
      validate(policy_, static_cast<std::int32_t>(units.size()));
    } catch (const std::invalid_argument& e) {
      std::string names;
      for (std::size_t u = 0; u < units.size(); ++u) {
        names += (u ? ", " : "") + std::to_string(u) + " ";
        for (std::size_t c = 0; c < units[u].size(); ++c) names += (c ? "+" : "") + units[u][c];
      }
      throw std::invalid_argument(std::string(e.what()) + " (the model's chain: " + names + ")");
    }
  }

  torch::jit::Module module_;
  CheckpointPolicy policy_;
  ChainRun chain_;
  std::unique_ptr<torch::jit::GraphFunction> chained_forward_;  // forward, its chain run as one
  std::int64_t host_only_ = 0;  // what the loader keeps besides tensors
  std::vector<at::Tensor> inputs_;
  at::Tensor targets_;
  LossSpec loss_;
};

}  // namespace

InputSpec parse_input_spec(const std::string& text) {
  InputSpec spec;
  const std::size_t colon = text.find(':');
  const std::string shape = text.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string dtype = text.substr(colon + 1);
    if (dtype == "f32") spec.dtype = c10::kFloat;
    else if (dtype == "f16") spec.dtype = c10::kHalf;
    else if (dtype == "bf16") spec.dtype = c10::kBFloat16;
    else if (dtype == "i64") spec.dtype = c10::kLong;
    else throw std::invalid_argument("--input " + text + ": unknown dtype '" + dtype + "' (f32, f16, bf16, i64)");
  }
  std::size_t start = 0;
  for (;;) {
    const std::size_t x = shape.find('x', start);
    spec.sizes.push_back(parse_positive(shape.substr(start, x - start), "--input " + text));
    if (x == std::string::npos) break;
    start = x + 1;
  }
  return spec;
}

LossSpec parse_loss_spec(const std::string& text) {
  if (text == "sum") return {};
  const std::string prefix = "cross_entropy:";
  if (text.rfind(prefix, 0) == 0)
    return {parse_positive(text.substr(prefix.size()), "--loss " + text)};
  throw std::invalid_argument("--loss must be sum or cross_entropy:CLASSES, got '" + text + "'");
}

bool is_script_path(const std::string& model) {
  auto ends_with = [&](const std::string& suffix) {
    return model.size() >= suffix.size() &&
           model.compare(model.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return model.find('/') != std::string::npos || ends_with(".pt") || ends_with(".pth") ||
         ends_with(".zip");
}

StepBuilder script_step(const ScriptConfig& config) {
  if (config.inputs.empty()) throw std::invalid_argument("a TorchScript model needs --input");
  // The interpreter runs the unoptimized graph: no fusion or autodiff
  // subgraphs, so traced and real runs execute the same ops.
  torch::jit::setGraphExecutorOptimize(false);
  auto on_meta = std::make_shared<torch::jit::Module>();
  try {
    *on_meta = load_onto_meta(config.path);
  } catch (const c10::Error& e) {
    throw std::invalid_argument("'" + config.path + "' is not a TorchScript file: " +
                                last_line(e.what_without_backtrace()));
  }
  return [on_meta, config] { return std::make_unique<ScriptStep>(*on_meta, config); };
}

}  // namespace metamem
