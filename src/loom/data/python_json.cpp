#include "loom/data/python_json.h"

namespace loom::data {

namespace {

void write(const nlohmann::ordered_json& j, int indent, int depth, std::string& out) {
  const bool container = j.is_object() || j.is_array();
  if (!container) {
    out.append(j.dump());  // scalars: nlohmann writes them as Python does
    return;
  }
  out.push_back(j.is_object() ? '{' : '[');
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!first) out.append(indent < 0 ? ", " : ",");
    first = false;
    if (indent >= 0) {
      out.push_back('\n');
      out.append(static_cast<size_t>((depth + 1) * indent), ' ');
    }
    if (j.is_object()) {
      out.append(nlohmann::ordered_json(it.key()).dump());
      out.append(": ");
    }
    write(it.value(), indent, depth + 1, out);
  }
  if (indent >= 0 && !j.empty()) {
    out.push_back('\n');
    out.append(static_cast<size_t>(depth * indent), ' ');
  }
  out.push_back(j.is_object() ? '}' : ']');
}

}  // namespace

std::string python_json(const nlohmann::ordered_json& j, int indent) {
  std::string out;
  write(j, indent, 0, out);
  return out;
}

}  // namespace loom::data
