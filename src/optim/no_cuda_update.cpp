// The CUDA optimizer updates of a build without CUDA: no CUDA tensor can exist there, so these
// are never reached through an optimizer; called directly they raise an Error naming the
// build option.
#include <strata/core/error.hpp>

#include "optim/cuda_update.h"

namespace strata::optim::cuda_update {

namespace {
[[noreturn]] void no_cuda(const char* op) {
  detail::throw_error("[{}] CUDA parameters need strata built with CUDA (reconfigure with -DSTRATA_WITH_CUDA=ON)",
                      op);
}
}  // namespace

void sgd(const std::vector<SgdItem>&, const math::SgdConsts<double>&) { no_cuda("SGD"); }
void adam(const std::vector<AdamItem>&, const math::AdamConsts<double>&) { no_cuda("Adam"); }
void adagrad(const std::vector<AdagradItem>&, const math::AdagradConsts<double>&) { no_cuda("Adagrad"); }
void rmsprop(const std::vector<RmspropItem>&, const math::RmspropConsts<double>&) { no_cuda("RMSprop"); }
Tensor lamb(const std::vector<LambItem>&, const math::LambConsts<double>&, double, double, double) {
  no_cuda("LAMB");
}
void adam8bit(const std::vector<Adam8bitItem>&, int64_t, const math::AdamConsts<double>&) { no_cuda("Adam8bit"); }
void check_step_not_captured(const Tensor&, const char*) {}
bool capturing(const Tensor&) { return false; }
const double* replay_slot(const Tensor&, size_t, std::function<void(double*)>, const char* op) { no_cuda(op); }
void check_states_exist(const ParamState&, std::initializer_list<const char*>, const char*) {}

}  // namespace strata::optim::cuda_update
