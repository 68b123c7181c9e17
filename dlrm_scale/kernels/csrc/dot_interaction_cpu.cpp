// DLRM's dot interaction on CPU: for each sample, the dot products of every pair (i < j) of its
// N vectors (the dense vector and the pooled embeddings), in the row-major upper-triangle order
// of torch.triu_indices(N, N, 1). A sample's vectors (27 x 64 floats here) stay in L1 while all
// of its pairs are formed, where a batched matmul computes the whole N x N Gram matrix and the
// autograd backward of its triangle gather scatters with an accumulating index_put.
// Backward: dC_i = sum_j g_ij C_j over the symmetric pair gradient, one pass over the pairs.
#include "kernels.h"

#include <ATen/Parallel.h>

namespace {

template <typename T>
void forward_sample(const T* c, T* out, int64_t n, int64_t d) {
  for (int64_t i = 0; i < n; ++i) {
    const T* ci = c + i * d;
    for (int64_t j = i + 1; j < n; ++j) {
      const T* cj = c + j * d;
      T sum = 0;
#pragma omp simd reduction(+ : sum)
      for (int64_t k = 0; k < d; ++k) sum += ci[k] * cj[k];
      *out++ = sum;
    }
  }
}

template <typename T>
void backward_sample(const T* c, const T* g, T* gc, int64_t n, int64_t d) {
  std::fill(gc, gc + n * d, T(0));
  for (int64_t i = 0; i < n; ++i) {
    const T* ci = c + i * d;
    T* gi = gc + i * d;
    for (int64_t j = i + 1; j < n; ++j) {
      const T w = *g++;
      const T* cj = c + j * d;
      T* gj = gc + j * d;
#pragma omp simd
      for (int64_t k = 0; k < d; ++k) {
        gi[k] += w * cj[k];
        gj[k] += w * ci[k];
      }
    }
  }
}

void check(const torch::Tensor& combined) {
  TORCH_CHECK(combined.device().is_cpu() && combined.dim() == 3, "dot interaction: a [B, N, D] CPU tensor");
}

}  // namespace

torch::Tensor dot_interaction_forward(const torch::Tensor& combined_in) {
  check(combined_in);
  const auto combined = combined_in.contiguous();
  const int64_t b = combined.size(0), n = combined.size(1), d = combined.size(2), pairs = n * (n - 1) / 2;
  auto out = torch::empty({b, pairs}, combined.options());
  AT_DISPATCH_FLOATING_TYPES(combined.scalar_type(), "dot_interaction_forward", [&] {
    const scalar_t* c = combined.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, b, 16, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) forward_sample(c + s * n * d, o + s * pairs, n, d);
    });
  });
  return out;
}

torch::Tensor dot_interaction_backward(const torch::Tensor& combined_in, const torch::Tensor& grad_in) {
  check(combined_in);
  const auto combined = combined_in.contiguous();
  const auto grad = grad_in.contiguous();
  const int64_t b = combined.size(0), n = combined.size(1), d = combined.size(2), pairs = n * (n - 1) / 2;
  TORCH_CHECK(grad.sizes() == torch::IntArrayRef({b, pairs}) && grad.scalar_type() == combined.scalar_type(),
              "dot interaction: the gradient must be [B, N(N-1)/2] of the input's dtype");
  auto out = torch::empty_like(combined);
  AT_DISPATCH_FLOATING_TYPES(combined.scalar_type(), "dot_interaction_backward", [&] {
    const scalar_t* c = combined.data_ptr<scalar_t>();
    const scalar_t* g = grad.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    at::parallel_for(0, b, 16, [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) backward_sample(c + s * n * d, g + s * pairs, o + s * n * d, n, d);
    });
  });
  return out;
}
