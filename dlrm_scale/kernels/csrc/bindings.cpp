#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rowwise_adagrad_backward", &rowwise_adagrad_backward,
        "Embedding backward with exact row-wise Adagrad fused in (fp32, CPU), updating weights and momentum in place");
  m.def("dot_interaction_forward", &dot_interaction_forward,
        "Upper-triangle pairwise dot products of each sample's vectors: [B, N, D] -> [B, N(N-1)/2]");
  m.def("dot_interaction_backward", &dot_interaction_backward,
        "Gradient of dot_interaction_forward with respect to its input");
  m.def("row_cache_install", &row_cache_install,
        "One batch of a cached shard: index, victims, write-backs, loads; returns (slot per id, overflow ids, counters)");
  m.def("row_cache_missing", &row_cache_missing, "Distinct ids not in the cache, ascending");
  m.def("row_store_read", &row_store_read, "Records of ids from a row store (base, optional log and location)");
}
