#include "estimator/HtmlReport.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "estimator/Units.h"
#include "profiler/Trace.h"

namespace metamem {
namespace {

// Colours by category, in report order: parameters, inputs and buffers,
// gradients, optimizer states, communication buffers, library workspaces,
// saved for backward, temporaries: one for each of profiler's categories.
constexpr std::array kCategoryColours = {"#4e79a7", "#9c755f", "#f28e2b", "#e15759",
                                         "#76b7b2", "#b07aa1", "#59a14f", "#edc948"};
static_assert(kCategoryColours.size() == kCategories, "a colour for each memory category");
constexpr const char* kReservedColour = "#555";

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string phase_colour(const std::string& phase) {
  if (phase == "forward") return "#e8f0fb";
  if (phase == "backward") return "#fbeee6";
  if (phase == "recompute") return "#f3e8fb";
  if (phase == "optimizer") return "#e9f6ea";
  return "#f4f4f4";
}

constexpr const char* kStyle = R"(
body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.sub{color:#666}.cards{display:flex;gap:12px;flex-wrap:wrap;margin:14px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 12px;min-width:150px}
.card b{display:block;font-size:19px}.card span{color:#666;font-size:12px}
svg text{font:11px system-ui,sans-serif;fill:#333}
.bars div.row{display:flex;align-items:center;gap:8px;margin:2px 0}
.bars .label{width:300px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.bars .bar{height:14px;border-radius:2px}.bars .value{color:#444;font-size:12px;white-space:nowrap}
table{border-collapse:collapse;width:100%;font-size:12px}th,td{padding:3px 6px;border-bottom:1px solid #eee}
th{background:#f6f6f6;cursor:pointer;text-align:left;position:sticky;top:0}td.n{text-align:right;font-variant-numeric:tabular-nums}
.scroll{max-height:480px;overflow:auto;border:1px solid #ddd}input{padding:4px 8px;width:320px;margin:6px 0}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
)";

// Sorting by a header's column (numbers by their raw value), filtering by
// text; errors are written on <body> for the page test to see.
constexpr const char* kScript = R"(
window.addEventListener('error',function(e){document.body.dataset.errors=(document.body.dataset.errors||'')+e.message+';'});
document.querySelectorAll('table.sortable').forEach(function(table){
  table.querySelectorAll('th').forEach(function(th,col){
    th.addEventListener('click',function(){
      var body=table.tBodies[0],rows=Array.from(body.rows),up=th.dataset.dir!=='down';
      th.dataset.dir=up?'down':'up';
      rows.sort(function(a,b){var x=a.cells[col],y=b.cells[col];
        var u=x.dataset.v!==undefined?Number(x.dataset.v):x.textContent,v=y.dataset.v!==undefined?Number(y.dataset.v):y.textContent;
        return (u<v?-1:u>v?1:0)*(up?-1:1);});
      rows.forEach(function(r){body.appendChild(r)});
    });
  });
});
var filter=document.getElementById('node-filter');
if(filter)filter.addEventListener('input',function(){
  var q=filter.value.toLowerCase();
  document.querySelectorAll('#nodes tbody tr').forEach(function(r){r.style.display=r.textContent.toLowerCase().indexOf(q)<0?'none':''});
});
document.body.dataset.rendered='true';
)";

std::int64_t total_of(const nlohmann::json& point) {
  std::int64_t total = 0;
  for (std::size_t c = 2; c + 1 < point.size(); ++c) total += point[c].get<std::int64_t>();
  return total;
}

// A power of two giving four to eight ticks, which read well in binary units.
double tick_step(double range) {
  double step = 1;
  while (range / step > 8) step *= 2;
  return step;
}

std::string module_or_none(const nlohmann::json& module) {
  return module.get<std::string>().empty() ? "(no module)" : module.get<std::string>();
}

std::string timeline_svg(const nlohmann::json& report) {
  const nlohmann::json& points = report["memory_over_time"]["points"];
  const nlohmann::json& categories = report["memory_over_time"]["categories"];
  if (points.empty()) return "<p>No events in the measured step.</p>";
  const bool cuda = report["device"] == "cuda";
  constexpr double kWidth = 1060, kHeight = 380, kLeft = 70, kRight = 16, kTop = 28, kBottom = 36;
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  const double first = points.front()[0].get<double>(), last = points.back()[0].get<double>();
  double top = 1;
  std::size_t peak = 0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    top = std::max(top, static_cast<double>(total_of(points[i])));
    if (cuda) top = std::max(top, points[i].back().get<double>());
    if (total_of(points[i]) > total_of(points[peak])) peak = i;
  }
  top *= 1.08;
  auto x = [&](const nlohmann::json& p) {
    return kLeft + (last == first ? 0 : (p[0].get<double>() - first) / (last - first) * plot_w);
  };
  auto y = [&](double bytes) { return kTop + plot_h - bytes / top * plot_h; };

  std::string svg = fmt::format(
      R"(<svg id="timeline" viewBox="0 0 {0} {1}" width="100%" role="img" aria-label="live memory over the step">)",
      kWidth, kHeight);
  // Phase bands, each labelled once.
  for (std::size_t i = 0; i < points.size();) {
    std::size_t j = i;
    while (j + 1 < points.size() && points[j + 1][1] == points[i][1]) ++j;
    const double x0 = x(points[i]), x1 = j + 1 < points.size() ? x(points[j + 1]) : kLeft + plot_w;
    const std::string phase = points[i][1].get<std::string>();
    svg += fmt::format(R"(<rect x="{:.1f}" y="{}" width="{:.1f}" height="{}" fill="{}"/>)", x0, kTop,
                       std::max(x1 - x0, 0.5), plot_h, phase_colour(phase));
    if (x1 - x0 > 40) svg += fmt::format(R"(<text x="{:.1f}" y="{}">{}</text>)", x0 + 4, kTop - 6, phase);
    i = j + 1;
  }
  // Y axis ticks.
  const double step = tick_step(top);
  for (double v = 0; v <= top; v += step) {
    svg += fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#ddd"/>)", kLeft, kLeft + plot_w, y(v), y(v));
    svg += fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end">{}</text>)", kLeft - 6, y(v) + 4,
                       human_bytes(static_cast<std::int64_t>(v)));
  }
  // Stacked areas, bottom (parameters) to top (temporaries).
  std::vector<double> below(points.size(), 0);
  for (std::size_t c = 0; c < categories.size(); ++c) {
    std::string upper, lower;
    for (std::size_t i = 0; i < points.size(); ++i) {
      const double b = below[i], t = b + points[i][2 + c].get<double>();
      upper += fmt::format("{:.1f},{:.1f} ", x(points[i]), y(t));
      below[i] = t;
      lower = fmt::format("{:.1f},{:.1f} ", x(points[i]), y(b)) + lower;
    }
    svg += fmt::format(R"(<polygon points="{}{}" fill="{}" fill-opacity="0.85"><title>{}</title></polygon>)", upper,
                       lower, kCategoryColours[c], escape(categories[c].get<std::string>()));
  }
  if (cuda) {
    std::string line;
    for (const auto& p : points) line += fmt::format("{:.1f},{:.1f} ", x(p), y(p.back().get<double>()));
    svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="1.5" stroke-dasharray="5 3"/>)",
                       line, kReservedColour);
  }
  // The peak, with its node and module.
  const nlohmann::json& predicted = report["predicted"];
  const double px = x(points[peak]), py = y(static_cast<double>(total_of(points[peak])));
  const std::string label = fmt::format("peak {} · {} · {}", human_bytes(predicted["peak_bytes"].get<std::int64_t>()),
                                        predicted["peak_node"].get<std::string>(),
                                        module_or_none(predicted["peak_module"]));
  const bool left = px > kLeft + plot_w * 0.6;
  svg += fmt::format(R"(<line x1="{0:.1f}" x2="{0:.1f}" y1="{1}" y2="{2:.1f}" stroke="#c00" stroke-dasharray="3 2"/>)", px,
                     kTop, kTop + plot_h);
  svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="4" fill="#c00"/>)", px, py);
  svg += fmt::format(R"(<text id="peak-label" x="{:.1f}" y="{:.1f}" text-anchor="{}" style="fill:#c00;font-weight:600">{}</text>)",
                     left ? px - 8 : px + 8, std::max(py - 8, kTop + 12.0), left ? "end" : "start", escape(label));
  svg += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">events of the measured step →</text>)",
                     kLeft + plot_w / 2, kHeight - 8);
  svg += "</svg>";

  std::string legend = R"(<div class="legend">)";
  for (std::size_t c = 0; c < categories.size(); ++c)
    legend += fmt::format(R"(<span><i style="background:{}"></i>{}</span>)", kCategoryColours[c],
                          escape(categories[c].get<std::string>()));
  if (cuda) legend += R"(<span><i style="background:#555;height:2px;vertical-align:3px"></i>reserved (simulated CUDA allocator)</span>)";
  return svg + legend + "</div>";
}

struct Bar {
  std::string label;
  std::int64_t bytes;
  std::string colour;
};

std::string bars(const std::vector<Bar>& rows) {
  std::int64_t most = 1;
  for (const Bar& r : rows) most = std::max(most, r.bytes);
  std::string out = R"(<div class="bars">)";
  for (const Bar& r : rows)
    out += fmt::format(
        R"(<div class="row"><div class="label" title="{0}">{0}</div><div class="bar" style="width:{1:.1f}%;background:{2}"></div><div class="value">{3}</div></div>)",
        escape(r.label), 60.0 * static_cast<double>(r.bytes) / static_cast<double>(most), r.colour, human_bytes(r.bytes));
  return out + "</div>";
}

std::string number_cell(std::int64_t value, bool flops) {
  return fmt::format(R"(<td class="n" data-v="{}">{}</td>)", value, flops ? human_flops(value) : human_bytes(value));
}

std::string html_rows_table(const nlohmann::json& rows, const char* id, bool nodes) {
  std::string out = fmt::format(R"(<div class="scroll"><table class="sortable" id="{}"><thead><tr>)", id);
  out += nodes ? "<th>node</th><th>op</th><th>module</th><th>phase</th>" : "<th>module</th>";
  out += "<th>fwd FLOPs</th><th>bwd FLOPs</th><th>fwd out</th><th>fwd tmp</th><th>bwd tmp</th><th>bwd out</th>"
         "<th>live after</th><th>peak</th></tr></thead><tbody>";
  for (const auto& r : rows) {
    out += "<tr>";
    if (nodes)
      out += fmt::format("<td>{}</td><td>{}</td><td>{}</td><td>{}</td>", escape(r["name"]), escape(r["op"]),
                         escape(r["module"]), escape(r["phase"]));
    else
      out += fmt::format("<td>{}</td>", escape(r["name"]));
    out += number_cell(r["fwd_flops"], true) + number_cell(r["bwd_flops"], true);
    for (const char* key : {"fwd_out", "fwd_tmp", "bwd_tmp", "bwd_out", "accumulated", "peak"})
      out += number_cell(r[key], false);
    out += "</tr>";
  }
  return out + "</tbody></table></div>";
}

// Peak bytes against recompute FLOPs for each budget of the search.
std::string checkpoint_svg(const nlohmann::json& checkpoint) {
  const nlohmann::json& curve = checkpoint["pareto"];
  constexpr double kWidth = 700, kHeight = 300, kLeft = 80, kBottom = 40, kTop = 16, kRight = 20;
  double most_flops = 1, most_peak = 1;
  for (const auto& p : curve) {
    most_flops = std::max(most_flops, p["recompute_flops"].get<double>());
    most_peak = std::max(most_peak, p["peak_bytes"].get<double>());
  }
  auto x = [&](double f) { return kLeft + f / most_flops * (kWidth - kLeft - kRight); };
  auto y = [&](double b) { return kTop + (kHeight - kTop - kBottom) * (1 - b / (most_peak * 1.05)); };
  std::string svg = fmt::format(R"(<svg id="checkpoint-curve" viewBox="0 0 {} {}" width="700">)",
                                kWidth, kHeight);
  std::string line;
  for (const auto& p : curve) {
    const double px = x(p["recompute_flops"].get<double>()), py = y(p["peak_bytes"].get<double>());
    line += fmt::format("{:.1f},{:.1f} ", px, py);
    svg += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="3" fill="#4e79a7"><title>budget {}: peak {}, recompute {}</title></circle>)",
                       px, py, human_bytes(p["budget_bytes"]), human_bytes(p["peak_bytes"]),
                       human_flops(p["recompute_flops"]));
  }
  svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="#4e79a7"/>)", line);
  svg += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">recompute FLOPs (0 to {}) →</text>)",
                     (kWidth + kLeft) / 2, kHeight - 10, human_flops(static_cast<std::int64_t>(most_flops)));
  svg += fmt::format(R"(<text x="{}" y="{}" text-anchor="end">{}</text><text x="{}" y="{}" text-anchor="end">0</text>)",
                     kLeft - 6, y(most_peak) + 4, human_bytes(static_cast<std::int64_t>(most_peak)), kLeft - 6,
                     y(0) + 4);
  return svg + "</svg>";
}

std::string card(const std::string& value, const std::string& what) {
  return fmt::format(R"(<div class="card"><b>{}</b><span>{}</span></div>)", escape(value), escape(what));
}

}  // namespace

std::string report_html(const nlohmann::json& report, const nlohmann::json& checkpoint) {
  const nlohmann::json& predicted = report["predicted"];
  const std::string model = report["model"];
  std::string html = "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>metamem · " +
                     escape(model) + "</title><style>" + kStyle + "</style></head><body>";
  html += fmt::format("<h1>metamem · {}</h1><div class=\"sub\">fake {} · batch {} · {} · optimizer {} · {} step(s), "
                      "the last measured</div>",
                      escape(model), escape(report["device"]), report["batch"].get<std::int64_t>(),
                      escape(report["dtype"]), escape(report["optimizer"]), report["steps"].get<std::int64_t>());
  html += "<div class=\"cards\">" + card(human_bytes(predicted["peak_bytes"]), "predicted peak");
  if (report.contains("achieved"))
    html += card(human_bytes(report["achieved"]["peak_bytes"]), "achieved peak (real CPU run)");
  if (report["device"] == "cuda")
    html += card(human_bytes(predicted["allocator_reserved_peak_bytes"]), "reserved peak (CUDA allocator)");
  html += card(predicted["peak_phase"].get<std::string>() + " · " + module_or_none(predicted["peak_module"]),
               "peak at " + predicted["peak_node"].get<std::string>());
  html += card(fmt::format("{}", report["model_states"]["parameters"].get<std::int64_t>()), "parameters") + "</div>";

  html += "<h2>Live memory over the step</h2>" + timeline_svg(report);

  html += "<h2>Live at the peak</h2><h3>By category</h3>";
  std::vector<Bar> by_category;
  const nlohmann::json& categories = report["memory_over_time"]["categories"];
  for (std::size_t c = 0; c < categories.size(); ++c)
    by_category.push_back({categories[c], predicted["live_at_peak"][categories[c].get<std::string>()], kCategoryColours[c]});
  html += bars(by_category) + "<h3>Saved for backward and temporaries, by the module that made them (top ten)</h3>";
  std::vector<Bar> by_module;
  for (const auto& m : predicted["live_at_peak_by_module"]) by_module.push_back({m["module"], m["bytes"], "#76b7b2"});
  html += bars(by_module);

  if (checkpoint.is_object() && checkpoint.contains("pareto") && !checkpoint["pareto"].empty())
    html += "<h2>Memory against recompute (checkpointing search)</h2>" + checkpoint_svg(checkpoint);

  html += "<h2>Modules</h2><p class=\"sub\">Click a column to sort.</p>" + html_rows_table(report["modules"], "modules", false);
  html += "<h2>Nodes</h2><input id=\"node-filter\" placeholder=\"filter nodes (name, op, module, phase)\">" +
          html_rows_table(report["nodes"], "nodes", true);
  html += std::string("<script>") + kScript + "</script></body></html>\n";
  return html;
}

}  // namespace metamem
