#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/cli/Commands.h"

namespace metamem::cli {

bool runs_on_python_engine(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "run") return true;  // a training script
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& a) { return a == "--hf" || a == "--timm" || a == "--torchtitan"; });
}

namespace {

// What `python -c program` prints, if it exits 0: a look, not an import
// of torch (seconds), so that a Python that cannot serve is named instead
// of exiting with its own silent status.
std::optional<std::string> python_says(const std::string& python, const char* program) {
  int out[2];
  if (pipe(out) != 0) return std::nullopt;
  const pid_t child = fork();
  if (child == 0) {
    dup2(out[1], 1);
    if (const int quiet = open("/dev/null", O_WRONLY); quiet >= 0) dup2(quiet, 2);
    close(out[0]);
    close(out[1]);
    execlp(python.c_str(), python.c_str(), "-c", program, nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string said;
  char buffer[4096];
  for (ssize_t n; (n = read(out[0], buffer, sizeof buffer)) > 0;) said.append(buffer, static_cast<std::size_t>(n));
  close(out[0]);
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return std::nullopt;
  return said;
}

// The Python of metamem's engine: $METAMEM_PYTHON, else the python3 beside
// this program (a virtual environment's bin/), else python3 on the PATH.
std::string metamem_python() {
  if (const char* chosen = std::getenv("METAMEM_PYTHON"); chosen != nullptr && *chosen != '\0') return chosen;
  std::error_code error;
  const auto beside = std::filesystem::read_symlink("/proc/self/exe", error).parent_path() / "python3";
  return !error && std::filesystem::exists(beside) ? beside.string() : "python3";
}

}  // namespace

void run_python_engine(const std::vector<std::string>& args) {
  const std::string python = metamem_python();
  if (!python_says(python, "import importlib.util, sys; sys.exit(importlib.util.find_spec('metamem') is None)"))
    throw std::invalid_argument(python + " cannot run metamem's Python engine for --hf, --timm, --torchtitan and run (it fails, or has "
                                "no metamem package); set METAMEM_PYTHON to the Python that has metamem and "
                                "transformers or timm");
  std::vector<std::string> command{python, "-m", "metamem"};
  command.insert(command.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  throw std::runtime_error("cannot run " + python + " -m metamem for --hf, --timm, --torchtitan and run (" + std::strerror(errno) +
                           "); set METAMEM_PYTHON to the Python that has metamem and transformers or timm");
}

std::optional<FakeGpu> fake_gpu_of_environment() {
  const char* folder = std::getenv("METAMEM_FAKE_GPU");
  if (folder == nullptr || *folder == '\0') return std::nullopt;
  try {
    check_fake_gpu(folder);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("METAMEM_FAKE_GPU: ") + e.what());
  }
  const std::string python = metamem_python();
  // The server is metamem's package's file, found without importing it.
  const auto server = python_says(python,
                                  "import importlib.util, os\n"
                                  "spec = importlib.util.find_spec('metamem')\n"
                                  "print(os.path.join(spec.submodule_search_locations[0], '_fake_gpu_server.py'), end='')");
  if (!server)
    throw std::invalid_argument("METAMEM_FAKE_GPU is set, and " + python + " has no metamem package to run the fake "
                                "GPU's recordings; set METAMEM_PYTHON to the Python that has metamem and torch");
  return FakeGpu{folder, python, *server};
}

}  // namespace metamem::cli
