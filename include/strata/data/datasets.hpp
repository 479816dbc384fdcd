// Datasets built from tensors or from other datasets: TensorDataset (inputs and targets
// sharing dim 0), TensorListDataset (any number of tensors sharing dim 0), Subset (a list of
// indices into another dataset) and ConcatDataset (datasets one after another).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>
#include <strata/data/dataset.hpp>

namespace strata::data {

/// Rows of two tensors that share dim 0: get(i) is Example{inputs[i], targets[i]}, views of
/// the stored tensors (no copy).
class STRATA_API TensorDataset : public Dataset<Example> {
 public:
  TensorDataset(Tensor inputs, Tensor targets);
  int64_t size() const override { return inputs_.size(0); }
  Example get(int64_t index) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
};

/// Rows of any number of tensors that share dim 0: get(i) is {t[i] for each tensor}.
class STRATA_API TensorListDataset : public Dataset<std::vector<Tensor>> {
 public:
  explicit TensorListDataset(std::vector<Tensor> tensors);
  int64_t size() const override { return tensors_.front().size(0); }
  std::vector<Tensor> get(int64_t index) const override;

 private:
  std::vector<Tensor> tensors_;
};

/// The samples of `dataset` at `indices`, in that order (PyTorch's Subset).
template <class Sample>
class Subset : public Dataset<Sample> {
 public:
  Subset(std::shared_ptr<const Dataset<Sample>> dataset, std::vector<int64_t> indices)
      : dataset_(std::move(dataset)), indices_(std::move(indices)) {
    STRATA_CHECK(dataset_ != nullptr, "[Subset] null dataset");
    int64_t n = dataset_->size();
    for (size_t k = 0; k < indices_.size(); ++k)
      STRATA_CHECK(indices_[k] >= 0 && indices_[k] < n, "[Subset] index {} (position {}) is outside [0, {})",
                   indices_[k], k, n);
  }
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  Sample get(int64_t index) const override {
    STRATA_CHECK(index >= 0 && index < size(), "[Subset] index {} is outside [0, {})", index, size());
    return dataset_->get(indices_[static_cast<size_t>(index)]);
  }
  const std::vector<int64_t>& indices() const { return indices_; }

 private:
  std::shared_ptr<const Dataset<Sample>> dataset_;
  std::vector<int64_t> indices_;
};

/// Several datasets one after another: index i falls in the first dataset whose cumulative
/// size exceeds i.
template <class Sample>
class ConcatDataset : public Dataset<Sample> {
 public:
  explicit ConcatDataset(std::vector<std::shared_ptr<const Dataset<Sample>>> datasets)
      : datasets_(std::move(datasets)) {
    int64_t total = 0;
    for (size_t k = 0; k < datasets_.size(); ++k) {
      STRATA_CHECK(datasets_[k] != nullptr, "[ConcatDataset] dataset {} is null", k);
      total += datasets_[k]->size();
      ends_.push_back(total);
    }
  }
  int64_t size() const override { return ends_.empty() ? 0 : ends_.back(); }
  Sample get(int64_t index) const override {
    STRATA_CHECK(index >= 0 && index < size(), "[ConcatDataset] index {} is outside [0, {})", index, size());
    auto k = static_cast<size_t>(std::upper_bound(ends_.begin(), ends_.end(), index) - ends_.begin());
    int64_t start = k == 0 ? 0 : ends_[k - 1];
    return datasets_[k]->get(index - start);
  }

 private:
  std::vector<std::shared_ptr<const Dataset<Sample>>> datasets_;
  std::vector<int64_t> ends_;  // cumulative sizes
};

}  // namespace strata::data
