// TensorDataset and TensorListDataset: rows of in-memory tensors, served as views.
#include <strata/data/datasets.hpp>

namespace strata::data {

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  STRATA_CHECK(inputs_.defined() && targets_.defined(), "[TensorDataset] undefined tensor");
  STRATA_CHECK(inputs_.dim() >= 1 && targets_.dim() >= 1, "[TensorDataset] tensors need a dim 0, got shapes {} and {}",
               inputs_.shape(), targets_.shape());
  STRATA_CHECK(inputs_.size(0) == targets_.size(0),
               "[TensorDataset] inputs {} and targets {} differ in dim 0", inputs_.shape(), targets_.shape());
}

Example TensorDataset::get(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < size(), "[TensorDataset] index {} is outside [0, {})", index, size());
  return Example{inputs_.select(0, index), targets_.select(0, index)};
}

TensorListDataset::TensorListDataset(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {
  STRATA_CHECK(!tensors_.empty(), "[TensorListDataset] needs at least one tensor");
  for (size_t k = 0; k < tensors_.size(); ++k) {
    STRATA_CHECK(tensors_[k].defined() && tensors_[k].dim() >= 1, "[TensorListDataset] tensor {} has no dim 0", k);
    STRATA_CHECK(tensors_[k].size(0) == tensors_[0].size(0), "[TensorListDataset] tensor {} has shape {}, tensor 0 {}: dim 0 differs",
                 k, tensors_[k].shape(), tensors_[0].shape());
  }
}

std::vector<Tensor> TensorListDataset::get(int64_t index) const {
  STRATA_CHECK(index >= 0 && index < size(), "[TensorListDataset] index {} is outside [0, {})", index, size());
  std::vector<Tensor> out;
  out.reserve(tensors_.size());
  for (const Tensor& t : tensors_) out.push_back(t.select(0, index));
  return out;
}

}  // namespace strata::data
