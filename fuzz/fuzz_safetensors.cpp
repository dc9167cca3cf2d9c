// Fuzzes the safetensors reader: any input either opens (and every tensor converts to f32
// within its bounds) or throws loom::Error; ASan/UBSan catch anything else.
#include <vector>

#include "fuzz_input.h"
#include "loom/io/safetensors.h"
#include "loom/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = loom::fuzz::input_file(data, size, ".safetensors");
  try {
    auto ck = loom::io::SafetensorsCheckpoint::open(path);
    std::vector<float> buf;
    for (const auto& name : ck.names()) {
      const auto* t = ck.find(name);
      if (t->numel() > (1 << 20)) continue;
      buf.resize(t->numel());
      try {
        ck.read_f32(name, t->shape, buf.data());
      } catch (const loom::Error&) {  // non-float dtypes
      }
    }
  } catch (const loom::Error&) {
  }
  return 0;
}
