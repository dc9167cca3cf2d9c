// JSON text as Python's json.dumps(x, ensure_ascii=False[, indent=N]) writes it, which is
// what Hugging Face chat templates' `tojson` filter gives: keys in their order, UTF-8 kept;
// compact: ", " and ": " separators; indented: one item per line, "," and ": ".
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace loom::data {

std::string python_json(const nlohmann::ordered_json& j, int indent = -1);

}  // namespace loom::data
