#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rowwise_adagrad_backward", &rowwise_adagrad_backward,
        "Embedding backward with exact row-wise Adagrad fused in (fp32, CPU), updating weights and momentum in place");
  m.def("dot_interaction_forward", &dot_interaction_forward,
        "Upper-triangle pairwise dot products of each sample's vectors: [B, N, D] -> [B, N(N-1)/2]");
  m.def("dot_interaction_backward", &dot_interaction_backward,
        "Gradient of dot_interaction_forward with respect to its input");
}
