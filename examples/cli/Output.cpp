#include "examples/cli/Output.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace metamem::cli {

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
  if (!out) throw std::runtime_error("cannot write '" + path + "'");
}

Progress::Progress(std::string task) : task_(std::move(task)), shown_(isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() { finish(); }

void Progress::finish() {
  if (shown_) fmt::print(stderr, "\r\033[K");
  shown_ = false;
}

void Progress::update(const std::string& status) {
  if (shown_) fmt::print(stderr, "\r\033[K{}: {}", task_, status);
}

}  // namespace metamem::cli
