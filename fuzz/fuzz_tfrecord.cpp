// Fuzzes the TensorBoard event-file reader (TFRecord framing, then protobuf Events): any
// input either reads or throws loom::Error naming the record; ASan/UBSan catch the rest.
#include "fuzz_input.h"
#include "loom/io/tb_events.h"
#include "loom/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = loom::fuzz::input_file(data, size, ".tfevents");
  try {
    loom::io::read_tb_scalars(path);
  } catch (const loom::Error&) {
  }
  return 0;
}
