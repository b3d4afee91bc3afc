#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/cli/Commands.h"

namespace metamem::cli {

bool names_python_model(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(), [](const std::string& a) { return a == "--hf" || a == "--timm"; });
}

void run_python_engine(const std::vector<std::string>& args) {
  std::string python = "python3";
  if (const char* chosen = std::getenv("METAMEM_PYTHON"); chosen != nullptr && *chosen != '\0') {
    python = chosen;
  } else {
    std::error_code error;
    const auto beside = std::filesystem::read_symlink("/proc/self/exe", error).parent_path() / "python3";
    if (!error && std::filesystem::exists(beside)) python = beside.string();
  }
  std::vector<std::string> command{python, "-m", "metamem"};
  command.insert(command.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : command) argv.push_back(arg.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  throw std::runtime_error("cannot run " + python + " -m metamem for --hf/--timm (" + std::strerror(errno) +
                           "); set METAMEM_PYTHON to the Python that has metamem and transformers or timm");
}

}  // namespace metamem::cli
