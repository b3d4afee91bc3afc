#include "estimator/Report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "estimator/Units.h"
#include "profiler/Chain.h"

namespace metamem {
namespace {

nlohmann::json row_json(const NodeRow& row) {
  return {{"name", row.name},           {"op", row.op},
          {"module", row.module},       {"phase", phase_name(row.phase)},
          {"fwd_flops", row.fwd_flops}, {"bwd_flops", row.bwd_flops},
          {"recompute_flops", row.recompute_flops},
          {"fwd_in", row.fwd_in},       {"fwd_tmp", row.fwd_tmp},
          {"fwd_out", row.fwd_out},     {"bwd_tmp", row.bwd_tmp},
          {"bwd_out", row.bwd_out},     {"accumulated", row.accumulated},
          {"peak", row.peak}};
}

nlohmann::json live_at_peak_modules_json(const Trace& trace, int depth) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [module, bytes] : live_at_peak_by_module(trace, depth)) out.push_back({{"module", module}, {"bytes", bytes}});
  return out;
}

nlohmann::json category_json(const CategoryBytes& bytes) {
  nlohmann::json out = nlohmann::json::object();
  for (std::size_t c = 0; c < kCategories; ++c)
    out[category_name(static_cast<Category>(c))] = bytes[c];
  return out;
}

// Sampled points as rows [event, phase, bytes by category..., reserved].
nlohmann::json memory_over_time_json(const std::vector<TimelinePoint>& timeline) {
  nlohmann::json categories = nlohmann::json::array(), points = nlohmann::json::array();
  for (std::size_t c = 0; c < kCategories; ++c) categories.push_back(category_name(static_cast<Category>(c)));
  for (const TimelinePoint& point : timeline) {
    nlohmann::json row = {point.event, phase_name(point.phase)};
    for (std::int64_t bytes : point.live) row.push_back(bytes);
    row.push_back(point.reserved);
    points.push_back(std::move(row));
  }
  return {{"columns", "event, phase, bytes by category, reserved"}, {"categories", categories}, {"points", points}};
}

std::vector<std::int64_t> step_peaks(const Trace& trace) {
  std::vector<std::int64_t> peaks;
  for (const StepSpan& step : trace.steps) peaks.push_back(step.peak_bytes);
  return peaks;
}

// The autocast dtype the steps ran under: "bf16", "f16" or "none".
std::string amp_name(const RunInfo& run) {
  if (!run.options || !run.options->autocast) return "none";
  return *run.options->autocast == at::kBFloat16 ? "bf16" : "f16";
}

// One rank's peak and what makes it: model states, activations kept for
// backward and communication buffers live at the peak (inputs and
// temporaries are the rest).
// ", rank of 8 data-parallel, ZeRO stage 3 (sharded over 4)"
std::string data_parallel_text(const DataParallel& dp) {
  return fmt::format(", rank of {} data-parallel, ZeRO stage {}{}{}", dp.ranks, dp.zero_stage,
                     dp.zero_stage == 3 && dp.shard_group() < dp.ranks
                         ? fmt::format(" (sharded over {})", dp.shard_group())
                         : "",
                     dp.forward_prefetch ? ", forward prefetch" : "");
}

nlohmann::json per_rank_json(const RunInfo& run, const Estimate& est) {
  auto at_peak = [&](Category c) { return est.live_at_peak[static_cast<std::size_t>(c)]; };
  const DataParallel dp = run.options ? run.options->data_parallel : DataParallel{};
  return {{"tensor_parallel", run.tensor_parallel},
          {"sequence_parallel", run.sequence_parallel},
          {"pipeline_parallel", run.pipeline.stages},
          {"pipeline_stage", run.pipeline.stage},
          {"schedule", schedule_name(run.options ? run.options->schedule : Schedule::OneFOneB)},
          {"data_parallel", dp.ranks},
          {"zero_stage", dp.zero_stage},
          {"shard_ranks", dp.zero_stage == 3 ? dp.shard_group() : 0},
          {"forward_prefetch", dp.forward_prefetch},
          {"peak_bytes", est.trace.measured().peak_bytes},
          {"model_states_bytes",
           at_peak(Category::Parameter) + at_peak(Category::Gradient) + at_peak(Category::OptimizerState)},
          {"activation_bytes", at_peak(Category::Activation)},
          {"communication_bytes", at_peak(Category::Communication)}};
}

}  // namespace

nlohmann::json gpu_memory_json(const GpuMemory& gpu, std::optional<std::int64_t> reserved_peak) {
  nlohmann::json beside = nlohmann::json::array();
  for (const GpuMemoryUse& use : gpu.beside_allocator)
    beside.push_back({{"what", use.what}, {"bytes", use.bytes}, {"basis", use.basis}});
  nlohmann::json out = {{"gpu", gpu.gpu},
                        {"total_bytes", gpu.total},
                        {"beside_allocator", beside},
                        {"allocator_bytes", gpu.allocator_bytes()}};
  if (reserved_peak) out["headroom_bytes"] = gpu.allocator_bytes() - *reserved_peak;
  return out;
}

nlohmann::json report_json(const RunInfo& run, const Estimate& est, int depth,
                           const StepPeaks& achieved) {
  const Trace& trace = est.trace;
  const NodeRow& peak_row = est.nodes.rows.at(est.nodes.peak_row);
  nlohmann::json nodes = nlohmann::json::array(), modules = nlohmann::json::array();
  for (const NodeRow& row : est.nodes.rows) nodes.push_back(row_json(row));
  for (const NodeRow& row : module_table(est.nodes, depth)) modules.push_back(row_json(row));
  std::vector<std::int64_t> timeline;
  for (std::size_t e = trace.measured().begin; e < trace.events.size(); ++e)
    timeline.push_back(trace.events[e].live_bytes);
  nlohmann::json out = {
      {"model", run.model},
      {"device", run.device},
      {"batch", run.batch},
      {"dtype", run.dtype},
      {"amp", amp_name(run)},
      {"optimizer", run.optimizer},
      {"alloc_conf", run.alloc_conf},
      {"steps", trace.steps.size()},
      {"predicted",
       {{"peak_bytes", trace.measured().peak_bytes},
        {"first_step_peak_bytes", trace.steps.front().peak_bytes},
        {"step_peaks", step_peaks(trace)},
        {"peak_phase", phase_name(est.nodes.peak_phase)},
        {"peak_event", trace.measured().peak_event},
        {"peak_node", peak_row.name},
        {"peak_module", peak_row.module},
        {"step_begin_bytes", trace.measured().begin_bytes},
        {"saved_for_backward_bytes", trace.saved_for_backward_bytes()},
        {"live_at_peak", category_json(est.live_at_peak)},
        {"live_at_peak_by_module", live_at_peak_modules_json(trace, depth)},
        {"allocator_allocated_peak_bytes", est.allocator.allocated},
        {"allocator_reserved_peak_bytes", est.allocator.reserved},
        {"ops", trace.ops.size()}}},
      {"model_states",
       {{"param_bytes", est.states.param_bytes},
        {"grad_bytes", est.states.grad_bytes},
        {"optimizer_bytes", est.states.optimizer_bytes},
        {"parameters", trace.parameter_count}}},
      {"per_rank", per_rank_json(run, est)},
      {"memonger",
       {{"algorithm", est.plan.plan.algorithm},
        {"planned_bytes", est.plan.stats.planned_bytes},
        {"lower_bound_bytes", est.plan.stats.lower_bound_bytes},
        {"baseline_bytes", est.plan.stats.baseline_bytes}}},
      {"nodes", nodes},
      {"modules", modules},
      {"timeline", timeline},
      {"memory_over_time", memory_over_time_json(est.timeline)}};
  if (run.options) {
    out["grad_accum"] = run.options->grad_accum;
    out["zero_grad"] = zero_grad_name(run.options->zero_grad);
    out["main_grads"] = run.options->fp32_main_grads ? "fp32" : "param";
  }
  if (run.gpu_memory) out["gpu_memory"] = gpu_memory_json(*run.gpu_memory, est.allocator.reserved);
  if (!achieved.empty())
    out["achieved"] = {{"peak_bytes", achieved.back()}, {"step_peaks", achieved}};
  if (!trace.refused.empty()) {
    nlohmann::json refused = nlohmann::json::array();
    for (const RefusedAllocation& r : trace.refused)
      refused.push_back({{"bytes", r.bytes}, {"phase", phase_name(r.phase)}, {"module", trace.scopes[r.scope]},
                         {"event", r.event}});
    out["out_of_memory_caught"] = refused;
  }
  return out;
}

std::string rows_table(const std::vector<NodeRow>& rows) {
  constexpr const char* kRow =
      "{:<36} {:<30} {:>9} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n";
  std::string out = fmt::format(kRow, "node", "module", "phase", "fwd_flops", "bwd_flops",
                                "recompute", "fwd_in", "fwd_tmp", "fwd_out", "bwd_tmp", "bwd_out",
                                "accum");
  for (const NodeRow& r : rows)
    out += fmt::format(kRow, r.name, r.module, phase_name(r.phase), human_flops(r.fwd_flops),
                       human_flops(r.bwd_flops), human_flops(r.recompute_flops),
                       human_bytes(r.fwd_in), human_bytes(r.fwd_tmp),
                       human_bytes(r.fwd_out), human_bytes(r.bwd_tmp), human_bytes(r.bwd_out),
                       human_bytes(r.accumulated));
  return out;
}

std::string rows_csv(const std::vector<NodeRow>& rows) {
  std::string out =
      "name,op,module,phase,fwd_flops,bwd_flops,recompute_flops,fwd_in,fwd_tmp,fwd_out,bwd_tmp,"
      "bwd_out,accumulated,peak\n";
  for (const NodeRow& r : rows)
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", r.name, r.op, r.module,
                       phase_name(r.phase), r.fwd_flops, r.bwd_flops, r.recompute_flops, r.fwd_in, r.fwd_tmp,
                       r.fwd_out, r.bwd_tmp, r.bwd_out, r.accumulated, r.peak);
  return out;
}

std::string summary_text(const RunInfo& run, const Estimate& est, const StepPeaks& achieved) {
  const Trace& trace = est.trace;
  const NodeRow& peak_row = est.nodes.rows.at(est.nodes.peak_row);
  std::string out;
  auto line = [&](const std::string& what, std::int64_t bytes, const std::string& note = "") {
    out += fmt::format("  {:<34}{:>14}{}{}\n", what, human_bytes(bytes), note.empty() ? "" : "   ",
                       note);
  };
  std::string how;  // how metamem ran the steps
  if (const auto& o = run.options)
    how = fmt::format(" (zero_grad {}{}{}{}{}{}{})", zero_grad_name(o->zero_grad),
                      o->grad_accum > 1 ? fmt::format(", {} micro-batches", o->grad_accum) : "",
                      o->fp32_main_grads ? ", fp32 main grads" : "",
                      o->autocast ? ", autocast " + amp_name(run) : "",
                      run.pipeline.stages > 1 ? fmt::format(", stage {} of {} ({})", run.pipeline.stage,
                                                            run.pipeline.stages, schedule_name(o->schedule))
                                              : "",
                      run.tensor_parallel > 1 ? fmt::format(", rank of {} tensor-parallel{}", run.tensor_parallel,
                                                            run.sequence_parallel ? " with sequence parallelism" : "")
                                              : "",
                      o->data_parallel.active() ? data_parallel_text(o->data_parallel) : "");
  out += fmt::format("model {}{} · {} · optimizer {} · fake device {} · {} step{}{} · {} ops traced\n",
                     run.model, run.batch > 0 ? fmt::format(" · batch {}", run.batch) : "", run.dtype,
                     run.optimizer, run.device, trace.steps.size(), trace.steps.size() == 1 ? "" : "s",
                     how, trace.ops.size());
  const double per_parameter = static_cast<double>(std::max<std::int64_t>(trace.parameter_count, 1));
  const std::int64_t model_states =
      est.states.param_bytes + est.states.grad_bytes + est.states.optimizer_bytes;
  line("parameters", est.states.param_bytes);
  line("gradients", est.states.grad_bytes);
  line("optimizer states", est.states.optimizer_bytes);
  line("model states", model_states,
       fmt::format("{:.1f} bytes per parameter", static_cast<double>(model_states) / per_parameter));
  line("live at step start", trace.measured().begin_bytes);
  line("saved for backward", trace.saved_for_backward_bytes());
  if (trace.steps.size() > 1) line("first step peak", trace.steps.front().peak_bytes);
  line(trace.steps.size() > 1 ? fmt::format("predicted peak (step {})", trace.steps.size())
                              : "predicted peak",
       trace.measured().peak_bytes,
       fmt::format("at {} ({}, module {})", peak_row.name, phase_name(est.nodes.peak_phase),
                   peak_row.module.empty() ? "-" : peak_row.module));
  out += "  live at the peak\n";
  for (std::size_t c = 0; c < kCategories; ++c)
    if (est.live_at_peak[c] > 0)
      line(fmt::format("  {}", category_name(static_cast<Category>(c))), est.live_at_peak[c]);
  line("CUDA allocator: max allocated", est.allocator.allocated);
  line("CUDA allocator: max reserved", est.allocator.reserved, run.alloc_conf);
  for (const RefusedAllocation& r : trace.refused)
    line("out of memory, caught", r.bytes,
         fmt::format("a request in {} (module {}) the allocator refused; it holds nothing", phase_name(r.phase),
                     trace.scopes[r.scope].empty() ? "-" : trace.scopes[r.scope]));
  if (const auto& gpu = run.gpu_memory) {
    line(fmt::format("GPU {}", gpu->gpu), gpu->total);
    for (const GpuMemoryUse& use : gpu->beside_allocator) line("  " + use.what, use.bytes, use.basis);
    const std::int64_t headroom = gpu->allocator_bytes() - est.allocator.reserved;
    line("  left to the CUDA allocator", gpu->allocator_bytes(),
         headroom >= 0 ? fmt::format("{} to spare at the reserved peak", human_bytes(headroom))
                       : fmt::format("short by {}: the step runs out of memory", human_bytes(-headroom)));
  }
  line("memonger plan", est.plan.stats.planned_bytes,
       fmt::format("{} · lower bound {} · planned/lower bound {:.4f}", est.plan.plan.algorithm,
                   human_bytes(est.plan.stats.lower_bound_bytes), est.plan.stats.ratio()));
  if (!achieved.empty()) {
    const std::int64_t predicted = trace.measured().peak_bytes, real = achieved.back();
    const double error = 100.0 * static_cast<double>(predicted - real) / static_cast<double>(real);
    line("achieved peak (real CPU)", real,
         fmt::format("error {:+.4f}% ({:+} B)", error, predicted - real));
  }
  return out;
}

namespace {

nlohmann::json segments_json(const std::vector<Segment>& segments, const std::vector<std::string>& names) {
  nlohmann::json out = nlohmann::json::array();
  for (const Segment& s : segments)
    out.push_back({{"first", names.at(static_cast<std::size_t>(s.first))},
                   {"last", names.at(static_cast<std::size_t>(s.last))},
                   {"inner", segments_json(s.inner, names)}});
  return out;
}

}  // namespace

nlohmann::json checkpoint_json(const CheckpointReport& r) {
  nlohmann::json pareto = nlohmann::json::array();
  for (const auto& p : r.pareto)
    pareto.push_back({{"budget_bytes", p.budget}, {"peak_bytes", p.peak}, {"recompute_flops", p.recompute_flops}});
  nlohmann::json out = {{"model", r.run.model},
                        {"device", r.run.device},
                        {"batch", r.run.batch},
                        {"dtype", r.run.dtype},
                        {"optimizer", r.run.optimizer},
                        {"budget_bytes", r.budget},
                        {"solver", r.solver},
                        {"peak_bytes", r.peak_bytes},
                        {"retraced_peak_bytes", r.retraced_peak_bytes},
                        {"unchecked_peak_bytes", r.unchecked_peak_bytes},
                        {"recompute_flops", r.recompute_flops},
                        {"step_flops", r.step_flops},
                        {"overhead", r.overhead()},
                        {"solver_ms", r.solver_ms},
                        {"traces", r.traces},
                        {"policy", segments_json(r.policy.segments, r.unit_names)},
                        {"policy_text", to_string(r.policy)},
                        {"units", r.unit_names},
                        {"pareto", pareto}};
  if (r.achieved_peak_bytes >= 0) out["achieved"] = {{"peak_bytes", r.achieved_peak_bytes}};
  return out;
}

std::string checkpoint_text(const CheckpointReport& r) {
  // A script's batch is its own (metamem run --budget): 0, left out as profile leaves it out.
  std::string out = fmt::format("model {}{} · {} · optimizer {} · fake device {} · {} units\n", r.run.model,
                                r.run.batch > 0 ? fmt::format(" · batch {}", r.run.batch) : "", r.run.dtype,
                                r.run.optimizer, r.run.device, r.unit_names.size());
  auto line = [&](const std::string& what, const std::string& value, const std::string& note = "") {
    out += fmt::format("  {:<30}{:>16}{}{}\n", what, value, note.empty() ? "" : "   ", note);
  };
  line("budget", human_bytes(r.budget));
  line("peak without checkpointing", human_bytes(r.unchecked_peak_bytes));
  if (!r.unit_names.empty())
    out += fmt::format("  units 0..{}: {} .. {}\n", r.unit_names.size() - 1, r.unit_names.front(),
                       r.unit_names.back());
  out += fmt::format("  policy ({}): {}   (segments of units by index, nested ones in brackets)\n",
                     r.solver, to_string(r.policy));
  if (r.traces > 0) {
    line("peak", human_bytes(r.peak_bytes), "traced");
  } else {
    line("predicted peak", human_bytes(r.peak_bytes), "simulated");
    line("re-traced peak", human_bytes(r.retraced_peak_bytes),
         r.retraced_peak_bytes == r.peak_bytes ? "equal"
                                               : fmt::format("{:+} B", r.retraced_peak_bytes - r.peak_bytes));
  }
  line("recompute", human_flops(r.recompute_flops),
       fmt::format("{:.1f}% of the step's {}", 100.0 * r.overhead(), human_flops(r.step_flops)));
  if (r.traces > 0)
    line("search time", fmt::format("{:.1f} s", r.solver_ms / 1000), fmt::format("{} trace{}", r.traces, r.traces == 1 ? "" : "s"));
  else
    line("solver time", fmt::format("{:.1f} ms", r.solver_ms));
  if (r.achieved_peak_bytes >= 0)
    line("achieved peak (real CPU)", human_bytes(r.achieved_peak_bytes),
         fmt::format("{:+} B", r.peak_bytes - r.achieved_peak_bytes));
  if (!r.pareto.empty()) {
    out += fmt::format("  {:>16} {:>16} {:>16}\n", "budget", "peak", "recompute");
    for (const auto& p : r.pareto)
      out += fmt::format("  {:>16} {:>16} {:>16}\n", human_bytes(p.budget), human_bytes(p.peak),
                         human_flops(p.recompute_flops));
  }
  return out;
}

}  // namespace metamem
