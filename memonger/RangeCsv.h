// Live ranges as CSV: `id,first,last,bytes[,pinned]`, one range a line. An
// optional header line, blank lines and lines starting with '#' are skipped.
#pragma once

#include <istream>
#include <ostream>
#include <vector>

#include "memonger/LiveRange.h"

namespace memonger {

// Throws InputError naming the line of the first malformed one.
std::vector<LiveRange> read_ranges_csv(std::istream& in);

void write_ranges_csv(std::ostream& out, const std::vector<LiveRange>& ranges);

}  // namespace memonger
