#include "estimator/FakeGpuRecordings.h"

#include <ATen/Context.h>
#include <ATen/core/ivalue.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "meta/MetaMode.h"
#include "meta/KernelRecording.h"

extern char** environ;

namespace metamem {
namespace {

using nlohmann::json;

constexpr const char* kRuntime = "libmetamem_fake_cuda_preload.so";
constexpr const char* kCublas = "libmetamem_fake_cublas.so";

[[noreturn]] void fail(const std::string& what) {
  throw std::runtime_error("metamem: the fake GPU's child: " + what + ": " + std::strerror(errno));
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  for (std::string& s : strings) result.push_back(s.data());
  result.push_back(nullptr);
  return result;
}

// The child: a Python running the server on the fake GPU, a request a line
// on its stdin, an answer a line ("@@" and JSON) on its stdout; its stderr
// kept in a file, for the error when it stops.
class Child {
 public:
  Child(FakeGpu fake_gpu, std::string gpu) : fake_gpu_(std::move(fake_gpu)), gpu_(std::move(gpu)) {}
  ~Child() { stop(); }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  std::string ask(const std::string& request) {
    if (pid_ >= 0 && waitpid(pid_, nullptr, WNOHANG) != 0) pid_ = -1;  // it stopped, and is reaped
    if (pid_ < 0) start();
    write_line(request);
    char* line = nullptr;
    std::size_t capacity = 0;
    std::string answer;
    while (getline(&line, &capacity, out_) >= 0) {
      if (std::strncmp(line, "@@", 2) == 0) {
        answer = line + 2;
        break;
      }
    }
    std::free(line);
    if (answer.empty()) throw std::runtime_error("metamem: the fake GPU of " + fake_gpu_.folder + " stopped on " +
                                                 request + ":\n" + errors_tail());
    return answer;
  }

 private:
  void start() {
    stop();
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) fail("pipe");
    errors_ = std::tmpfile();
    if (!errors_) fail("tmpfile");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fileno(errors_), 2);
    std::vector<std::string> argv{fake_gpu_.python, fake_gpu_.server, fake_gpu_.folder + "/" + kRuntime, gpu_};
    std::vector<std::string> env = fake_gpu_environment(fake_gpu_.folder);
    const int spawned = posix_spawnp(&pid_, fake_gpu_.python.c_str(), &actions, nullptr, pointers(argv).data(),
                                     pointers(env).data());
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    in_ = in[1];
    out_ = fdopen(out[0], "r");
    if (spawned != 0) {
      pid_ = -1;
      errno = spawned;
      fail("cannot run " + fake_gpu_.python);
    }
  }

  void stop() {
    if (in_ >= 0) close(in_);
    if (out_) std::fclose(out_);
    if (pid_ >= 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (errors_) std::fclose(errors_);
    in_ = -1, out_ = nullptr, pid_ = -1, errors_ = nullptr;
  }

  // A child that stopped closes the pipe: the write fails with EPIPE, and
  // the SIGPIPE it raises is taken here, not by the process.
  void write_line(const std::string& request) {
    const std::string line = request + "\n";
    sigset_t broken_pipe, previous;
    sigemptyset(&broken_pipe);
    sigaddset(&broken_pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &broken_pipe, &previous);
    for (std::size_t written = 0; written < line.size();) {
      const ssize_t n = write(in_, line.data() + written, line.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const timespec now{};
        sigtimedwait(&broken_pipe, nullptr, &now);
        break;  // the read that follows finds the child stopped
      }
      written += static_cast<std::size_t>(n);
    }
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  }

  std::string errors_tail() {
    std::string text;
    std::rewind(errors_);
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, errors_)) > 0;) text.append(buffer, n);
    return text.size() > 3000 ? text.substr(text.size() - 3000) : text;
  }

  FakeGpu fake_gpu_;
  std::string gpu_;
  pid_t pid_ = -1;
  int in_ = -1;
  std::FILE* out_ = nullptr;
  std::FILE* errors_ = nullptr;
};

// An argument as the child makes it again: a tensor by its sizes, strides,
// dtype (torch's Python name) and whether it is on the host (indices may
// be); a device is the child's one GPU.
json described(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) return nullptr;
    return {{"size", t.sizes().vec()},
            {"stride", t.strides().vec()},
            {"dtype", std::string(c10::getDtypeNames(t.scalar_type()).first)},
            {"on_host", t.is_cpu()}};
  }
  if (value.isList()) {
    json items = json::array();
    for (const c10::IValue& item : value.toListRef()) items.push_back(described(item));
    return items;
  }
  if (value.isNone()) return nullptr;
  if (value.isBool()) return value.toBool();
  if (value.isInt()) return value.toInt();
  if (value.isDouble()) return value.toDouble();
  if (value.isString()) return value.toStringRef();
  if (value.isDevice()) return {{"device", "cuda"}};
  throw std::invalid_argument(std::string("metamem: a recorded op's argument of kind ") + value.tagKind() +
                              " cannot be sent to the fake GPU");
}

// Whether what the call allocates depends on the values of its tensors,
// which the fake GPU does not compute (it reads zeros): indexing by a
// boolean mask allocates by its count of trues. Such a call is traced by
// metamem's own models.
bool sized_by_values(const std::string& op, c10::ArrayRef<c10::IValue> arguments) {
  if (op.find("index_put") == std::string::npos) return false;
  for (const c10::IValue& index : arguments[1].toListRef()) {
    if (!index.isTensor()) continue;
    const c10::ScalarType dtype = index.toTensor().scalar_type();
    if (dtype == c10::ScalarType::Bool || dtype == c10::ScalarType::Byte) return true;
  }
  return false;
}

}  // namespace

std::string fake_device_json(const GpuSpec& gpu) {
  return json{{"name", gpu.name},
              {"total_memory", gpu.total_memory},
              {"major", gpu.major},
              {"minor", gpu.minor},
              {"multi_processor_count", gpu.multi_processor_count},
              {"L2_cache_size", gpu.l2_cache_size},
              {"max_threads_per_multi_processor", gpu.max_threads_per_multi_processor},
              {"shared_memory_per_block_optin", gpu.shared_memory_per_block_optin},
              {"shared_memory_per_multiprocessor", gpu.shared_memory_per_multi_processor},
              {"clock_rate", gpu.clock_rate},
              {"memory_clock_rate", gpu.memory_clock_rate},
              {"memory_bus_width", gpu.memory_bus_width},
              {"max_active_clusters", gpu.max_active_clusters}}
      .dump();
}

// The child of one fake GPU and GPU, and its answers by call.
class KernelRecordings {
 public:
  KernelRecordings(FakeGpu fake_gpu, std::string gpu) : child_(std::move(fake_gpu), std::move(gpu)) {}

  std::optional<ScratchPlan> plan(const std::string& op, c10::ArrayRef<c10::IValue> arguments) {
    json request{{"op", op}, {"arguments", json::array()}};
    for (const c10::IValue& argument : arguments) request["arguments"].push_back(described(argument));
    const at::Context& context = at::globalContext();
    request["cudnn"] = {{"enabled", context.userEnabledCuDNN()},
                        {"benchmark", context.benchmarkCuDNN()},
                        {"deterministic", context.deterministicCuDNN()},
                        {"allow_tf32", context.allowTF32CuDNN()}};
    // Deterministic algorithms change paths (index_put_ sorts) and fill
    // what resize_ grows (through a tensor of one element).
    request["algorithms"] = {{"deterministic", context.deterministicAlgorithms()},
                             {"warn_only", context.deterministicAlgorithmsWarnOnly()},
                             {"fill_uninitialized_memory", context.deterministicFillUninitializedMemory()}};
    const std::string key = request.dump();
    std::lock_guard<std::mutex> hold(lock_);  // backward asks from autograd's thread
    auto found = plans_.find(key);
    if (found == plans_.end()) {
      const json answer = json::parse(child_.ask(key));  // a child that stopped is asked again at the next call
      Plan plan;
      try {
        plan.first = recorded_plan(answer.dump());
        if (answer.contains("repeat")) plan.repeat = recorded_plan(answer["repeat"].dump());
      } catch (const std::runtime_error&) {  // real torch's error, raised at each such call
        plan.error = std::current_exception();
      }
      found = plans_.emplace(key, std::move(plan)).first;
    }
    if (found->second.error) std::rethrow_exception(found->second.error);
    // Each trace stands for a process of its own, whose first call of a kind
    // is its first (cuDNN's benchmark searches then, and torch keeps the
    // engine it found for the process).
    if (met_in_trace_ != trace_number()) met_.clear(), kept_.clear(), met_in_trace_ = trace_number();
    const bool first = met_.insert(key).second;
    ScratchPlan plan = !first && found->second.repeat ? *found->second.repeat : found->second.first;
    // Under cuDNN's heuristics (torch's default), a convolution whose
    // workspace the allocator refuses runs the next engine.
    if (op.starts_with("aten::convolution") && context.userEnabledCuDNN() && !context.benchmarkCuDNN())
      plan.engines = std::make_shared<CallEngines>(*this, key);
    return plan;
  }

  // What the fake GPU's torch says of its cuDNN and CUDA runtime.
  CudnnBuild cudnn_build() {
    std::lock_guard<std::mutex> hold(lock_);
    const json facts = json::parse(child_.ask(R"({"facts": true})"));
    return {facts.at("cudnn").get<long>(), facts.at("cudnn_runtime").get<long>(), facts.at("cudart").get<long>()};
  }

 private:
  // A convolution's engines: the next ones as the fake GPU answers, and
  // the one it last ran in this trace.
  class CallEngines final : public WorkspaceEngines {
   public:
    CallEngines(KernelRecordings& recordings, std::string key) : recordings_(recordings), key_(std::move(key)) {}
    std::optional<std::int64_t> next(std::size_t piece, const std::vector<std::int64_t>& refused) override {
      return recordings_.workspace_after(key_, piece, refused);
    }
    std::optional<std::int64_t> kept(std::size_t piece) override {
      std::lock_guard<std::mutex> hold(recordings_.lock_);
      const auto found = recordings_.kept_.find({key_, piece});
      return found == recordings_.kept_.end() ? std::nullopt : std::optional(found->second);
    }
    void ran(std::size_t piece, std::int64_t bytes) override {
      std::lock_guard<std::mutex> hold(recordings_.lock_);
      recordings_.kept_[{key_, piece}] = bytes;
    }

   private:
    KernelRecordings& recordings_;
    std::string key_;
  };

  // The bytes piece `piece` of the call `key` has where the allocator
  // refused it at each of `refused` bytes, as the fake GPU answers.
  std::optional<std::int64_t> workspace_after(const std::string& key, std::size_t piece,
                                              const std::vector<std::int64_t>& refused) {
    json request = json::parse(key);
    request["workspace"] = piece;
    request["refused"] = refused;
    const std::string asked = request.dump();
    std::lock_guard<std::mutex> hold(lock_);
    auto found = workspaces_.find(asked);
    if (found == workspaces_.end()) {
      const json answer = json::parse(child_.ask(asked));
      const json& bytes = answer.at("bytes");
      found =
          workspaces_.emplace(asked, bytes.is_null() ? std::nullopt : std::optional(bytes.get<std::int64_t>())).first;
    }
    return found->second;
  }

  // A call's plan the first time a trace makes it and, where it differs,
  // at the next times; or the error its recording holds.
  struct Plan {
    ScratchPlan first;
    std::optional<ScratchPlan> repeat;
    std::exception_ptr error;
  };
  Child child_;
  std::mutex lock_;
  std::unordered_map<std::string, Plan> plans_;
  std::unordered_map<std::string, std::optional<std::int64_t>> workspaces_;  // workspace_after's answers
  std::map<std::pair<std::string, std::size_t>, std::int64_t> kept_;  // by call and piece, in trace met_in_trace_
  std::unordered_set<std::string> met_;  // the calls the trace numbered met_in_trace_ has made
  std::uint64_t met_in_trace_ = 0;
};

std::vector<std::string> fake_gpu_environment(const std::string& folder) {
  std::vector<std::string> env;
  std::string library_path = folder + "/driver";
  for (char** entry = environ; *entry; ++entry) {
    const std::string_view variable(*entry);
    if (variable.starts_with("LD_PRELOAD=")) continue;
    if (variable.starts_with("LD_LIBRARY_PATH=")) {
      library_path += ":" + std::string(variable.substr(std::strlen("LD_LIBRARY_PATH=")));
      continue;
    }
    env.emplace_back(variable);
  }
  env.push_back("LD_PRELOAD=" + folder + "/" + kRuntime + " " + folder + "/" + kCublas);
  env.push_back("LD_LIBRARY_PATH=" + library_path);
  return env;
}

void check_fake_gpu(const std::string& folder) {
  if (!std::filesystem::exists(std::filesystem::path(folder) / kRuntime))
    throw std::invalid_argument("the folder '" + folder + "' holds no fake GPU (" + kRuntime +
                                "; built in build/oracle)");
}

const std::vector<std::string>& recorded_ops() {
  // cuDNN's calls; and sorting, whose temporaries cub sizes by its tuning
  // for the GPU's architecture (radix sort's extra buffers, bins and
  // look-back tiles: 3,204,607 B for 262,144 floats on an H100), as topk
  // over large slices (its radix selection's counts, sized by the GPU's
  // SMs), the median of a whole tensor, index_put_ accumulating (the
  // gradient of rows gathered by ids), an embedding's gradient past 3,072
  // ids and an EmbeddingBag's do.
  static const std::vector<std::string> ops{"aten::convolution",
                                            "aten::convolution_backward",
                                            "aten::_cudnn_rnn",
                                            "aten::_cudnn_rnn_backward",
                                            "aten::_cudnn_init_dropout_state",
                                            "aten::_scaled_dot_product_cudnn_attention",
                                            "aten::_scaled_dot_product_cudnn_attention_backward",
                                            "aten::sort",
                                            "aten::sort.stable",
                                            "aten::topk",
                                            "aten::median",
                                            "aten::nanmedian",
                                            "aten::index_put_",
                                            "aten::_index_put_impl_",
                                            "aten::embedding_dense_backward",
                                            "aten::_embedding_bag_dense_backward"};
  return ops;
}

ScratchPlan recorded_plan(const std::string& text) {
  const json recording = json::parse(text);
  if (recording.contains("error")) throw std::runtime_error(recording["error"].get<std::string>());
  KernelRecording call;
  using Kind = KernelRecording::Event::Kind;
  for (const json& event : recording.at("events")) {
    const Kind kind = event[0] == "alloc" ? Kind::Alloc : event[0] == "empty_cache" ? Kind::EmptyCache : Kind::Free;
    call.events.push_back({kind, event[1].get<std::int64_t>(), event[2].get<std::int64_t>()});
  }
  for (const json& addresses : recording.at("returns"))
    call.returns.push_back(addresses.is_array() ? addresses.get<std::vector<std::int64_t>>()
                                                : std::vector<std::int64_t>{addresses.get<std::int64_t>()});
  call.sizes = recording.at("sizes").get<std::vector<std::vector<std::int64_t>>>();
  call.strides = recording.at("strides").get<std::vector<std::vector<std::int64_t>>>();
  ScratchPlan plan;
  try {
    plan = plan_of(call, "the fake GPU's recording");
  } catch (const std::runtime_error& error) {
    throw std::runtime_error(error.what() + (": " + text));
  }
  if (std::count_if(plan.steps.begin(), plan.steps.end(),
                    [](const ScratchPlan::Step& step) { return step.kind == ScratchPlan::Step::Kind::CublasCall; }) > 1)
    throw std::runtime_error("metamem: the fake GPU's recording keeps more than a cuBLAS workspace: " + text);
  return plan;
}

FakeGpuRecordings::FakeGpuRecordings(const FakeGpu& fake_gpu, const GpuSpec& gpu) {
  check_fake_gpu(fake_gpu.folder);
  FakeGpu absolute = fake_gpu;  // the child's paths, wherever the step changes to
  absolute.folder = std::filesystem::absolute(fake_gpu.folder).string();
  const std::string key = absolute.folder + "\n" + std::string(gpu.key);
  static std::mutex lock;
  static std::map<std::string, std::shared_ptr<KernelRecordings>> per_process;
  std::lock_guard<std::mutex> hold(lock);
  auto& kernels = per_process[key];
  if (!kernels) kernels = std::make_shared<KernelRecordings>(absolute, fake_device_json(gpu));
  kernels_ = kernels;
}

FollowRecordingsScope::FollowRecordingsScope(const FakeGpuRecordings& recordings)
    : cudnn_([&] { return recordings.kernels_->cudnn_build(); }) {
  set_recorded_plans(recorded_ops(), [kernels = recordings.kernels_](const std::string& op,
                                                                     c10::ArrayRef<c10::IValue> arguments) {
    return sized_by_values(op, arguments) ? std::nullopt : kernels->plan(op, arguments);
  });
}

FollowRecordingsScope::~FollowRecordingsScope() { set_recorded_plans({}, nullptr); }

}  // namespace metamem
