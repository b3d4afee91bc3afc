// Live ranges as CSV, in either of two layouts told apart by the header:
//  - ours: `id,first,last,bytes[,pinned]`, both steps included; the header
//    is optional;
//  - MiniMalloc's: header `id,lower,upper,size`, alive over [lower, upper).
// Blank lines and lines starting with '#' are skipped.
#pragma once

#include <istream>
#include <ostream>
#include <vector>

#include "memonger/LiveRange.h"

namespace memonger {

enum class RangeLayout { kMetamem, kMiniMalloc };

struct RangeTable {
  std::vector<LiveRange> ranges;  // steps included, whatever the layout
  RangeLayout layout = RangeLayout::kMetamem;
};

// Throws InputError naming the line of the first malformed one.
RangeTable read_ranges_csv(std::istream& in);

// The table in its own layout; with `offsets` (one per range, a plan's), an
// `offset` column added.
void write_ranges_csv(std::ostream& out, const RangeTable& table, const std::vector<std::int64_t>& offsets = {});

}  // namespace memonger
