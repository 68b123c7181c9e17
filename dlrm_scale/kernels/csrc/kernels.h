// dlrm_scale's CPU kernels, compiled into one extension (dlrm_scale/cpu_kernels.py) and bound in bindings.cpp.
#pragma once
#include <torch/extension.h>

// FBGEMM's rowwise Adagrad embedding backward contract; see rowwise_adagrad_cpu.cpp.
void rowwise_adagrad_backward(const torch::Tensor& grad_output, torch::Tensor& weights, const torch::Tensor& weights_offsets,
                              const torch::Tensor& D_offsets, const torch::Tensor& hash_size_cumsum, const torch::Tensor& indices,
                              const torch::Tensor& offsets, int64_t pooling_mode, const torch::Tensor& indice_weights,
                              torch::Tensor& momentum, const torch::Tensor& momentum_offsets, double learning_rate, double eps);

// DLRM's dot interaction; see dot_interaction_cpu.cpp.
torch::Tensor dot_interaction_forward(const torch::Tensor& combined);
torch::Tensor dot_interaction_backward(const torch::Tensor& combined, const torch::Tensor& grad_pairs);

// A cached shard's per-batch work and its row store's reads; see row_cache_cpu.cpp.
std::vector<torch::Tensor> row_cache_install(const torch::Tensor& ids, torch::Tensor& tags, torch::Tensor& last_used,
                                             torch::Tensor& frequency, torch::Tensor& way_frequency, int64_t num_rows, int64_t clock,
                                             const torch::Tensor& overflow_ids, int64_t overflow_rows, torch::Tensor& weights,
                                             std::vector<torch::Tensor> states, torch::Tensor& dirty, torch::Tensor& memory,
                                             std::vector<int64_t> fds, bool direct, torch::Tensor& location, int64_t width,
                                             int64_t log_rows, std::vector<torch::Tensor> maps, int64_t log_used,
                                             const torch::Tensor& staged_ids, const torch::Tensor& staged_records, bool training);
torch::Tensor row_cache_missing(const torch::Tensor& ids, const torch::Tensor& tags, int64_t num_rows);
torch::Tensor row_store_read(const torch::Tensor& ids, torch::Tensor& memory, std::vector<int64_t> fds, bool direct,
                             torch::Tensor& location, int64_t width, int64_t log_rows, std::vector<torch::Tensor> maps);
