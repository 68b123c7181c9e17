// The embedding backward with exact row-wise Adagrad fused in, for fp32 tables on CPU.
//
// Same contract as FBGEMM's split_embedding_backward_codegen_rowwise_adagrad_cpu: for every
// row looked up in the batch, sum its gradient over the bags that used it (times the bag's
// per-id weight, or 1/L under mean pooling), then
//     h += mean(g^2);  w -= lr * g / (sqrt(h) + eps)
// FBGEMM 1.8's CPU kernel spends ~500 ns per distinct row of a large table on this class of
// machine: it prefetches the next weight row only, never the momentum. Distinct rows of a
// big table are cold, so the update is memory-latency bound; here the row ids of each table
// are radix-sorted once and the weight row and momentum of the row 12 runs ahead are
// prefetched, so the misses overlap.
#include "kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kRadixBits = 11;
constexpr int kPrefetchRuns = 12;

struct TableGroup {
  int64_t first_feature, end_feature;  // features [first, end) share this table
};

// Features that share a table are contiguous and carry the same weights offset (FBGEMM's layout).
std::vector<TableGroup> table_groups(const int64_t* weights_offsets, int64_t num_features) {
  std::vector<TableGroup> groups;
  for (int64_t f = 0; f < num_features; ++f) {
    if (groups.empty() || weights_offsets[f] != weights_offsets[groups.back().first_feature]) {
      groups.push_back({f, f + 1});
    } else {
      groups.back().end_feature = f + 1;
    }
  }
  return groups;
}

// Stable LSD radix sort of (row, position) pairs by row.
void sort_by_row(std::vector<uint32_t>& rows, std::vector<uint32_t>& positions, uint32_t max_row) {
  const size_t n = rows.size();
  std::vector<uint32_t> rows_out(n), positions_out(n);
  // digits until the largest row's bits run out (shifts of 32 or more are undefined on uint32)
  for (int shift = 0; shift < 32 && (shift == 0 || (max_row >> shift) != 0); shift += kRadixBits) {
    std::vector<uint32_t> count((1u << kRadixBits) + 1, 0);
    for (size_t i = 0; i < n; ++i) ++count[((rows[i] >> shift) & ((1u << kRadixBits) - 1)) + 1];
    for (size_t d = 0; d < (1u << kRadixBits); ++d) count[d + 1] += count[d];
    for (size_t i = 0; i < n; ++i) {
      const uint32_t at = count[(rows[i] >> shift) & ((1u << kRadixBits) - 1)]++;
      rows_out[at] = rows[i];
      positions_out[at] = positions[i];
    }
    rows.swap(rows_out);
    positions.swap(positions_out);
  }
}

template <typename index_t, typename offset_t>
void update_table(const TableGroup& group, int64_t B, const float* grad_output, int64_t grad_stride, float* weights,
                  float* momentum, const int64_t* weights_offsets, const int32_t* D_offsets, int64_t num_rows,
                  const int64_t* momentum_offsets, const index_t* indices, const offset_t* offsets,
                  const float* indice_weights, bool mean_pooling, float learning_rate, float eps) {
  const int64_t begin = offsets[group.first_feature * B];
  const int64_t end = offsets[group.end_feature * B];
  const int64_t n = end - begin;
  if (n == 0) return;
  TORCH_CHECK(n < (int64_t(1) << 32), "too many ids for one table in one batch: ", n);
  const int D = D_offsets[group.first_feature + 1] - D_offsets[group.first_feature];
  // bag of each id: (feature - first) * B + sample, to find its gradient row and column
  std::vector<uint32_t> rows(n), positions(n), bag_of(n);
  uint32_t max_row = 0;
  for (int64_t bag = 0; bag < (group.end_feature - group.first_feature) * B; ++bag) {
    const int64_t lo = offsets[group.first_feature * B + bag], hi = offsets[group.first_feature * B + bag + 1];
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t row = indices[p];
      TORCH_CHECK(row >= 0 && row < num_rows, "embedding id ", row, " out of range [0, ", num_rows, ")");
      rows[p - begin] = static_cast<uint32_t>(row);
      positions[p - begin] = static_cast<uint32_t>(p - begin);
      bag_of[p - begin] = static_cast<uint32_t>(bag);
      max_row = std::max(max_row, static_cast<uint32_t>(row));
    }
  }
  sort_by_row(rows, positions, max_row);
  std::vector<int64_t> run_starts;
  run_starts.reserve(n + 1);
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || rows[i] != rows[i - 1]) run_starts.push_back(i);
  }
  const int64_t runs = static_cast<int64_t>(run_starts.size());
  run_starts.push_back(n);

  float* table = weights + weights_offsets[group.first_feature];
  float* h = momentum + momentum_offsets[group.first_feature];
  std::vector<float> g(D);
  for (int64_t r = 0; r < runs; ++r) {
    if (r + kPrefetchRuns < runs) {
      const int64_t ahead = rows[run_starts[r + kPrefetchRuns]];
      __builtin_prefetch(h + ahead, 1);
      for (int d = 0; d < D; d += 16) __builtin_prefetch(table + ahead * D + d, 1);
    }
    std::memset(g.data(), 0, D * sizeof(float));
    for (int64_t i = run_starts[r]; i < run_starts[r + 1]; ++i) {
      const uint32_t q = positions[i];
      const int64_t bag = bag_of[q];
      const int64_t feature = group.first_feature + bag / B, sample = bag % B;
      float scale = indice_weights ? indice_weights[begin + q] : 1.0f;
      if (mean_pooling) {
        const int64_t bag_index = group.first_feature * B + bag;
        scale /= static_cast<float>(offsets[bag_index + 1] - offsets[bag_index]);
      }
      const float* src = grad_output + sample * grad_stride + D_offsets[feature];
      for (int d = 0; d < D; ++d) g[d] += scale * src[d];
    }
    float squares = 0.0f;
    for (int d = 0; d < D; ++d) squares += g[d] * g[d];
    const int64_t row = rows[run_starts[r]];
    const float h_row = h[row] + squares / static_cast<float>(D);
    h[row] = h_row;
    const float step = learning_rate / (std::sqrt(h_row) + eps);
    float* w = table + row * D;
    for (int d = 0; d < D; ++d) w[d] -= step * g[d];
  }
}

}  // namespace

void rowwise_adagrad_backward(const torch::Tensor& grad_output, torch::Tensor& weights, const torch::Tensor& weights_offsets,
                              const torch::Tensor& D_offsets, const torch::Tensor& hash_size_cumsum, const torch::Tensor& indices,
                              const torch::Tensor& offsets, int64_t pooling_mode, const torch::Tensor& indice_weights,
                              torch::Tensor& momentum, const torch::Tensor& momentum_offsets, double learning_rate, double eps) {
  TORCH_CHECK(weights.scalar_type() == torch::kFloat && momentum.scalar_type() == torch::kFloat, "fp32 weights and momentum only");
  TORCH_CHECK(pooling_mode == 0 || pooling_mode == 1, "sum or mean pooling only, got pooling mode ", pooling_mode);
  const auto grad = grad_output.to(torch::kFloat).contiguous();
  const auto weights_offsets_ = weights_offsets.to(torch::kLong).contiguous();
  const auto D_offsets_ = D_offsets.to(torch::kInt).contiguous();
  const auto hash_size_cumsum_ = hash_size_cumsum.to(torch::kLong).contiguous();
  const auto momentum_offsets_ = momentum_offsets.to(torch::kLong).contiguous();
  const auto per_id_weights = indice_weights.defined() && indice_weights.numel() > 0 ? indice_weights.to(torch::kFloat).contiguous()
                                                                                      : torch::Tensor();
  const int64_t num_features = weights_offsets_.size(0);
  TORCH_CHECK(num_features > 0 && (offsets.numel() - 1) % num_features == 0, "offsets do not match the features");
  const int64_t B = (offsets.numel() - 1) / num_features;
  const auto groups = table_groups(weights_offsets_.data_ptr<int64_t>(), num_features);
  const int64_t* cumsum = hash_size_cumsum_.data_ptr<int64_t>();
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "rowwise_adagrad_backward_indices", [&] {
    using ids_t = index_t;
    AT_DISPATCH_INDEX_TYPES(offsets.scalar_type(), "rowwise_adagrad_backward_offsets", [&] {
      using offs_t = index_t;
      at::parallel_for(0, static_cast<int64_t>(groups.size()), 1, [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) {
          const auto& group = groups[t];
          const int64_t num_rows = cumsum[group.end_feature] - cumsum[group.first_feature];
          update_table<ids_t, offs_t>(group, B, grad.data_ptr<float>(), grad.size(1), weights.data_ptr<float>(),
                                      momentum.data_ptr<float>(), weights_offsets_.data_ptr<int64_t>(),
                                      D_offsets_.data_ptr<int32_t>(), num_rows, momentum_offsets_.data_ptr<int64_t>(),
                                      indices.data_ptr<ids_t>(), offsets.data_ptr<offs_t>(),
                                      per_id_weights.defined() ? per_id_weights.data_ptr<float>() : nullptr,
                                      pooling_mode == 1, static_cast<float>(learning_rate), static_cast<float>(eps));
        }
      });
    });
  });
}
