// Fuzzes the GGUF reader: open, read every metadata value, dequantize every tensor it can
// (bounded sizes), and build the HF config; anything but loom::Error is a finding.
#include <vector>

#include "fuzz_input.h"
#include "loom/io/gguf.h"
#include "loom/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = loom::fuzz::input_file(data, size, ".gguf");
  try {
    auto f = loom::io::GgufFile::open(path);
    for (const auto& [k, v] : f.metadata()) (void)v.type_str();
    std::vector<float> buf;
    for (const auto& t : f.tensors()) {
      if (!loom::io::ggml_can_dequantize(t.type) || t.numel() > (1 << 20)) continue;
      buf.resize(t.numel());
      loom::io::dequantize_rows(t, 0, t.n_rows(), buf.data());
    }
    try {
      (void)loom::io::gguf_hf_config(f);
    } catch (const loom::Error&) {
    }
  } catch (const loom::Error&) {
  }
  return 0;
}
