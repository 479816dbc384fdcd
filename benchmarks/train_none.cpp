// Built when LibTorch is not found: there is no twin, and the table shows strata alone.
#include "train_workload.h"

namespace bench {

std::unique_ptr<Trainer> make_torch_trainer(const TrainConfig&) { return nullptr; }
std::string torch_name() { return {}; }
void torch_set_threads(int) {}

}  // namespace bench
