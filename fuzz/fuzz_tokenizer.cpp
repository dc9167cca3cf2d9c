// Fuzzes tokenizer.json parsing and, when a file parses, encoding/decoding of the input
// itself as text (every pre-tokenizer path, invalid UTF-8 included).
#include <string>

#include "fuzz_input.h"
#include "loom/data/tokenizer.h"
#include "loom/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = loom::fuzz::input_file(data, size, ".json");
  try {
    auto tok = loom::data::Tokenizer::from_hf_json(path);
    const std::string text(reinterpret_cast<const char*>(data), std::min<size_t>(size, 4096));
    auto ids = tok.encode(text);
    (void)tok.decode(ids);
  } catch (const loom::Error&) {
  }
  return 0;
}
