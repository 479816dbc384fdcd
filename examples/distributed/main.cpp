// Data-parallel training with DistributedDataParallel, launched by MPI:
//
//   mpirun -np 4 ./distributed_train --epochs 20
//
// Every rank builds the same dataset (three interleaved spirals, generated from a seed) and
// model; a DistributedSampler gives each rank its share of every epoch's shuffled order; DDP
// averages the gradients, so the ranks stay identical. Rank 0 prints each epoch's mean loss
// over the ranks and the accuracy on the whole dataset; at the end every rank checks that its
// parameters equal everyone else's. With --zero the optimizer state is sharded over the ranks
// (ZeroRedundancyOptimizer): the same steps, bit for bit, with each rank keeping a part. With
// --fsdp the parameters, gradients and optimizer state are all sharded (FullyShardedDataParallel,
// each Linear a unit): each rank keeps a part of everything and gathers a layer while it runs.
#include <cmath>
#include <cstdio>

#include <CLI/CLI.hpp>

#include <strata/strata.hpp>

namespace {

using namespace strata;
namespace F = nn::functional;

struct Options {
  int64_t epochs = 20, batch = 32, points = 600;
  double lr = 0.1, bucket_mb = 25;
  std::string backend = "mpi";
  bool zero = false, fsdp = false;
};

// `points` points of 3 spirals: inputs (points, 2), labels (points) in {0, 1, 2}
std::pair<Tensor, Tensor> spirals(int64_t points) {
  Generator gen(2024);
  Tensor t = rand({points}, TensorOptions(kFloat64), &gen);
  std::vector<int64_t> labels(static_cast<size_t>(points));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 3);
  Tensor label = from_vector(labels);
  Tensor angle = t * 4.0 + label.to(kFloat64) * (2.0 * M_PI / 3.0);
  Tensor noise = randn({points, 2}, TensorOptions(kFloat64), &gen) * 0.03;
  Tensor x = stack({t * cos(angle), t * sin(angle)}, 1) + noise;
  return {x.to(kFloat32), label};
}

struct Mlp : nn::Module {
  nn::Linear fc1{2, 64}, fc2{64, 64}, fc3{64, 3};
  Mlp() {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  Tensor forward(const Tensor& x) override { return fc3(relu(fc2(relu(fc1(x))))); }
};

int train(const Options& o) {
  dist::init_process_group(o.backend);
  const int rank = dist::get_rank(), world = dist::get_world_size();
  const Device device = o.backend == "nccl" ? Device::cuda(cuda::current_device()) : kCPU;
  auto [x, y] = spirals(o.points);
  x = x.to(device);
  y = y.to(device);
  manual_seed(1000 + static_cast<uint64_t>(rank));  // different on each rank: DDP copies rank 0's
  Mlp net;
  net.to(device);
  std::unique_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<dist::FullyShardedDataParallel> fsdp;
  if (o.fsdp) fsdp = std::make_unique<dist::FullyShardedDataParallel>(
                  net, dist::FSDPOptions{.auto_wrap_policy = dist::module_wrap_policy<nn::Linear>()});
  else ddp = std::make_unique<dist::DistributedDataParallel>(net, dist::DDPOptions{.bucket_cap_mb = o.bucket_mb});
  auto model = [&](const Tensor& input) { return fsdp ? (*fsdp)(input) : (*ddp)(input); };
  const optim::SGDOptions sgd{.lr = o.lr, .momentum = 0.9};
  std::unique_ptr<optim::Optimizer> opt;
  if (o.zero) opt = std::make_unique<dist::ZeroRedundancyOptimizer<optim::SGD>>(net.parameters(), sgd);
  else opt = std::make_unique<optim::SGD>(fsdp ? fsdp->parameters() : net.parameters(), sgd);
  data::DistributedSampler sampler(o.points, rank, world, {.seed = 7});
  if (rank == 0) std::printf("%d ranks, %lld points each epoch\n", world, static_cast<long long>(o.points));
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    std::vector<int64_t> order = sampler.indices(epoch);
    double loss_sum = 0;
    int64_t steps = 0;
    for (size_t start = 0; start + static_cast<size_t>(o.batch) <= order.size(); start += o.batch) {
      std::vector<int64_t> rows(order.begin() + start, order.begin() + start + o.batch);
      Tensor idx = from_vector(rows).to(device);
      Tensor loss = F::cross_entropy(model(x.index_select(0, idx)), y.index_select(0, idx));
      loss.backward();
      opt->step();
      opt->zero_grad();
      loss_sum += loss.item<double>();
      ++steps;
    }
    Tensor mean_loss = full({1}, steps ? loss_sum / steps : 0.0, TensorOptions(kFloat64, device));
    dist::all_reduce(mean_loss, dist::ReduceOp::Avg);
    NoGradGuard no_grad;
    const double accuracy = (model(x).argmax(1) == y).to(kFloat64).mean().item<double>();
    if (rank == 0)
      std::printf("epoch %lld loss %.4f accuracy %.1f%%\n", static_cast<long long>(epoch + 1),
                  mean_loss.item<double>(), 100 * accuracy);
  }
  // the ranks took identical steps: the largest and smallest value of every parameter agree
  bool identical = true;
  std::vector<Tensor> params = net.parameters();
  if (fsdp) {  // the whole model's values, gathered on every rank
    params.clear();
    for (auto& [name, p] : fsdp->full_state_dict(/*rank0_only=*/false)) params.push_back(p);
  }
  for (const Tensor& p : params) {
    Tensor hi = p.detach().clone(), lo = p.detach().clone();
    dist::all_reduce(hi, dist::ReduceOp::Max);
    dist::all_reduce(lo, dist::ReduceOp::Min);
    identical = identical && equal(hi, lo);
  }
  std::printf("rank %d: parameters %s on all %d ranks\n", rank, identical ? "identical" : "DIFFER", world);
  return identical ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Data-parallel training of an MLP on three spirals; launch with mpirun -np N");
  app.add_option("--epochs", o.epochs, "passes over the dataset")->check(CLI::Range(int64_t{1}, int64_t{100000}));
  app.add_option("--batch", o.batch, "points per step on each rank")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--points", o.points, "dataset size")->check(CLI::Range(int64_t{3}, int64_t{1} << 24));
  app.add_option("--lr", o.lr, "SGD learning rate (momentum 0.9)")->check(CLI::PositiveNumber);
  app.add_option("--bucket-mb", o.bucket_mb, "DDP bucket cap in MiB")->check(CLI::PositiveNumber);
  auto* zero = app.add_flag("--zero", o.zero, "shard the optimizer state over the ranks (ZeRO-1)");
  app.add_flag("--fsdp", o.fsdp, "shard parameters, gradients and optimizer state (FSDP, ZeRO-3)")->excludes(zero);
  app.add_option("--backend", o.backend, "mpi (CPU) or nccl (CUDA)")->check(CLI::IsMember({"mpi", "nccl"}));
  CLI11_PARSE(app, argc, argv);
  try {
    return train(o);
  } catch (const strata::Error& e) {
    std::fprintf(stderr, "distributed_train: %s\n", e.what());
    return 1;
  }
}
