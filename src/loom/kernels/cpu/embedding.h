// Embedding lookup: out[n, :] (=|+=) table[ids[n], :] for n < N; table[rows, C].
// Backward scatters: dtable[ids[n], :] += dout[n, :]. Ids are checked against rows.
#pragma once

#include <cstdint>

namespace loom::kernels {

void embedding_forward(float* out, const int32_t* ids, int64_t N, const float* table, int64_t rows,
                       int64_t C, bool accumulate);
void embedding_backward(float* dtable, const int32_t* ids, int64_t N, const float* dout, int64_t C);

}  // namespace loom::kernels
