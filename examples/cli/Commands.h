// The metamem commands: each parses its arguments (the command name
// excluded) and returns the exit code; mistakes throw UsageError.
#pragma once

#include <string>
#include <vector>

namespace metamem::cli {

int profile_command(const std::vector<std::string>& args);
int plan_command(const std::vector<std::string>& args);
int fit_command(const std::vector<std::string>& args);
int checkpoint_command(const std::vector<std::string>& args);

}  // namespace metamem::cli
