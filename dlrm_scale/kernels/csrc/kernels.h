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
