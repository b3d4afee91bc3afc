// What the CLI writes beside stdout: files, and progress on a terminal.
#pragma once

#include <string>

namespace metamem::cli {

// Writes `contents` to `path`; throws std::runtime_error naming the file.
void write_file(const std::string& path, const std::string& contents);

// One line on stderr, rewritten as work goes on, when stderr is a terminal
// (nothing otherwise, so logs and pipes stay clean); cleared when done.
class Progress {
 public:
  explicit Progress(std::string task);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void update(const std::string& status);
  void finish();  // clears the line now

 private:
  std::string task_;
  bool shown_;
};

}  // namespace metamem::cli
