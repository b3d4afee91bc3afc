// Independent traces on several cores. Processes, not threads: a trace's
// state is the process's (the active tracer, the MetaMode, the autograd
// engine's single thread per device, which runs every fake-cuda backward).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace metamem::cli {

// Runs task(0) .. task(count - 1) in up to `jobs` forked processes, each
// taking the next task not yet taken, and returns their results in task
// order. `done(finished)` is called in this process as results arrive. An
// exception in a task is rethrown here as std::runtime_error with its
// message; so is a process that dies. With one job or one task, runs here.
// Fork before anything has started threads (no trace has run yet).
std::vector<std::string> run_in_processes(std::size_t count, int jobs,
                                          const std::function<std::string(std::size_t)>& task,
                                          const std::function<void(std::size_t)>& done = {});

// The processes to run: the cores this process may use.
int default_jobs();

}  // namespace metamem::cli
