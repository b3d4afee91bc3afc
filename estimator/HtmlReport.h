// The report as one self-contained HTML page: inline SVG charts, CSS and a
// little JavaScript (sortable and filterable tables); nothing is fetched.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace metamem {

// `report` is what report_json returns; `checkpoint`, when not null, what
// checkpoint_json returns (its memory-vs-recompute curve is drawn).
std::string report_html(const nlohmann::json& report, const nlohmann::json& checkpoint = nullptr);

}  // namespace metamem
