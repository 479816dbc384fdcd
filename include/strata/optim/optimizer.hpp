// The base of every optimizer in strata::optim: parameter groups with their own
// hyperparameters, per-parameter state, step() / zero_grad(), and state dicts that restore a
// run exactly. A concrete optimizer (SGD, AdamW, ...) derives from OptimizerFor<Options> and
// supplies its per-parameter update; see sgd.hpp for the shape of one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <strata/core/error.hpp>
#include <strata/core/export.hpp>
#include <strata/core/tensor.hpp>

namespace strata::optim {

/// A snapshot of an optimizer's or a scheduler's state, enough to continue a run bit for bit:
/// the type that wrote it, named tensors and named scalars. Plain data, so a checkpoint
/// writer can store it as it is (safetensors: the tensors, with type and scalars as metadata).
///
/// Optimizer keys: "group.<g>.<hyperparameter>" and "group.<g>.num_params" for each group,
/// "state.<i>.step" and "state.<i>.<name>" for parameter i counted across the groups in order.
struct StateDict {
  std::string type;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> scalars;
};

/// Parameters updated with the same hyperparameters, e.g. weights with weight decay and
/// biases and norms without:
///   AdamWOptions decay{.lr = 1e-3, .weight_decay = 0.1}, no_decay = decay;
///   no_decay.weight_decay = 0;
///   AdamW opt({{weights, decay}, {biases, no_decay}});
/// A group written as {params}, without options, takes the `defaults` given to the optimizer's
/// constructor (as a torch.optim group without hyperparameters does):
///   AdamW opt({{weights}, {biases, no_decay}}, AdamWOptions{.lr = 3e-4});  // weights: lr 3e-4
template <class Options>
struct ParamGroup {
  /// A group that takes the optimizer's defaults.
  ParamGroup(std::vector<Tensor> params) : params(std::move(params)), takes_defaults(true) {}  // NOLINT
  ParamGroup(std::vector<Tensor> params, Options options)
      : params(std::move(params)), options(std::move(options)) {}

  std::vector<Tensor> params;
  Options options{};
  /// True until an optimizer gives the group its defaults; `options` must not be changed before
  /// that (the optimizer raises Error rather than drop the change).
  bool takes_defaults = false;
};

/// What an optimizer keeps for one parameter: the number of updates applied to it and named
/// state tensors (moments, buffers), which live on the parameter's device.
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> tensors;
};

/// One parameter's share of a step, as Optimizer::update_cuda receives it: the parameter, its
/// grad (of the parameter's shape, dtype and device, laid out as the parameter: Note
/// [Parameter layouts] in src/optim/update_util.h) and its state.
struct ParamUpdate {
  Tensor param;
  Tensor grad;
  ParamState* state;
};

/// A state tensor an optimizer keeps for a parameter, as load_state_dict checks it.
struct StateSpec {
  std::string name;
  Shape shape;
  DType dtype;
  bool required = true;  // false: may be absent, created on first use (SGD's momentum buffer, or a
                         // state an option switched on after some steps asks for)
};

class STRATA_API Optimizer {
 public:
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Updates every parameter whose grad is defined, with gradient recording off. When given,
  /// `closure` runs first, with gradient recording on, and its result is returned (it
  /// typically zeroes the grads, computes the loss and calls backward).
  /// (step, state_dict and load_state_dict are virtual for wrappers such as
  /// dist::ZeroRedundancyOptimizer, which schedulers, GradScaler and checkpoints then drive.)
  virtual Tensor step(const std::function<Tensor()>& closure = {});
  /// Clears every parameter's grad: undefined when set_to_none, else zero-filled.
  void zero_grad(bool set_to_none = true);

  /// A copy of the state (state tensors are cloned), so further steps do not change it.
  virtual StateDict state_dict() const;
  /// Restores a state_dict() of an optimizer of the same type with the same group layout and
  /// parameter shapes; on any mismatch raises Error and leaves this optimizer unchanged.
  virtual void load_state_dict(const StateDict& dict);
  /// A function that puts back the state this optimizer has now, with no collective call: what
  /// io::load_checkpoint keeps to undo a load. The default holds a state_dict(); a sharded
  /// optimizer (dist::ZeroRedundancyOptimizer) holds its own rank's part.
  virtual std::function<void()> restore_point();

  /// The optimizer's name ("AdamW"), also the StateDict type.
  const std::string& name() const { return name_; }
  virtual size_t num_param_groups() const = 0;
  virtual const std::vector<Tensor>& group_params(size_t group) const = 0;
  /// Every parameter, group by group.
  std::vector<Tensor> params() const;

  // ---- what schedulers change ---------------------------------------------------------
  virtual double lr(size_t group) const = 0;
  virtual void set_lr(size_t group, double lr) = 0;
  /// Whether the groups have a momentum-like hyperparameter (momentum, or beta1 for the Adam
  /// family) for OneCycleLR to cycle.
  virtual bool has_momentum() const { return false; }
  virtual double momentum(size_t group) const;
  virtual void set_momentum(size_t group, double momentum);
  /// The lr a scheduler counts from (PyTorch's "initial_lr"), recorded by the first scheduler
  /// attached to the optimizer; saved in the state dict.
  std::optional<double> initial_lr(size_t group) const;
  /// Raises Error unless lr is finite and >= 0.
  void set_initial_lr(size_t group, double lr);

  /// The state of `param`, or null before its first update (or when it is not optimized here).
  const ParamState* state(const Tensor& param) const;

 protected:
  explicit Optimizer(std::string name) : name_(std::move(name)) {}

  /// One parameter's update. `grad` has the parameter's shape, dtype and device and is laid
  /// out as the parameter; the parameter has passed check_param. step() calls it for CPU parameters.
  virtual void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) = 0;
  /// The update of the parameters of group `group` in `batch`, which share one CUDA device and
  /// one dtype: the built-in optimizers update them all in a few multi-tensor kernel launches.
  /// The default calls update() for each, which must then work on device tensors.
  virtual void update_cuda(size_t group, const std::vector<ParamUpdate>& batch);
  /// The state tensors update() keeps for `param` under the group's current options.
  virtual std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const = 0;
  /// `st`, kept under the options the group had at the last step or load, in the layout of its
  /// current options, or nullopt when it already is (Note [Option changes] in optimizer.cpp).
  /// Replaces or erases entries but never writes into a tensor: `st` may share them. The
  /// default erases the tensors state_specs() no longer lists.
  virtual std::optional<ParamState> converted_state(size_t group, const Tensor& param, const ParamState& st) const;
  /// A parameter's state as a state dict holds it (the group's options already loaded), in the
  /// form this optimizer keeps for `param`; load_state_dict then checks it against
  /// state_specs(). The default keeps it as it is; Adam8bit turns 8-bit codes into 32-bit
  /// moments and back, so a dict loads whatever the parameter's memory layout. A state it
  /// cannot convert is returned as it is, for those checks to name what is wrong.
  virtual ParamState state_from_dict(size_t /*group*/, const Tensor& /*param*/, ParamState st) const { return st; }
  /// Records that every state now has the layout of the groups' current options.
  virtual void mark_synced() = 0;
  /// Validates every group's options; raises Error naming the group and the bad value.
  virtual void check_all_options() const = 0;
  virtual void save_options(std::map<std::string, double>& scalars) const = 0;
  /// Replaces every group's options with those in `scalars` (validated first: on Error nothing
  /// changes); restore_options() undoes the last load_options().
  virtual void load_options(const std::map<std::string, double>& scalars) = 0;
  virtual void restore_options() = 0;

  /// Checks every parameter of every group: defined, a floating leaf of float32 or float64 on
  /// the CPU or a CUDA device, contiguous (or channels-last when 4-d), and listed once across
  /// all groups.
  void check_params() const;

 private:
  void check_param(const Tensor& p, size_t group, size_t index) const;
  void check_state(const Tensor& p, size_t group, const ParamState& state) const;

  // keyed by the parameter's identity; holding the parameter keeps the key valid
  struct Entry {
    Tensor param;
    ParamState state;
  };
  std::string name_;
  std::unordered_map<const TensorImpl*, Entry> state_;
  std::vector<std::optional<double>> initial_lrs_;  // by group
  uint64_t last_scheduler_ = 0;  // the id of the LRScheduler whose step() set the lrs last (0: none)

  friend class LRScheduler;
};

/// An optimizer whose groups carry hyperparameters of type Options. Options is an aggregate
/// with at least `double lr` and a static for_each_field(self, f) that calls f(name, field)
/// for each hyperparameter (double or bool); validate_options(const Options&), found by
/// argument-dependent lookup, raises Error for a bad value.
template <class Options>
class OptimizerFor : public Optimizer {
 public:
  using Group = ParamGroup<Options>;

  /// The groups, with their hyperparameters; change them between steps (schedulers do).
  std::vector<Group>& param_groups() { return groups_; }
  const std::vector<Group>& param_groups() const { return groups_; }
  /// The options given at construction, used by add_param_group(params).
  const Options& defaults() const { return defaults_; }

  // a new group has no state yet, so synced_options() may fall back to its options
  void add_param_group(Group group) {
    give_defaults(group, groups_.size());
    validate_options(group.options);
    groups_.push_back(std::move(group));
    try {
      check_params();
    } catch (...) {
      groups_.pop_back();
      throw;
    }
  }
  void add_param_group(std::vector<Tensor> params) { add_param_group(Group{std::move(params), defaults_}); }

  size_t num_param_groups() const override { return groups_.size(); }
  const std::vector<Tensor>& group_params(size_t g) const override { return group(g).params; }
  double lr(size_t g) const override { return group(g).options.lr; }
  void set_lr(size_t g, double lr) override { group(g).options.lr = lr; }

  bool has_momentum() const override { return kHasBetas || kHasMomentum; }
  double momentum(size_t g) const override {
    if constexpr (kHasBetas) return group(g).options.betas[0];
    else if constexpr (kHasMomentum) return group(g).options.momentum;
    else return Optimizer::momentum(g);
  }
  void set_momentum(size_t g, double m) override {
    if constexpr (kHasBetas) group(g).options.betas[0] = m;
    else if constexpr (kHasMomentum) group(g).options.momentum = m;
    else Optimizer::set_momentum(g, m);
  }

 protected:
  OptimizerFor(std::string name, std::vector<Group> groups, Options defaults)
      : Optimizer(std::move(name)), defaults_(std::move(defaults)), groups_(std::move(groups)) {
    size_t total = 0;
    for (const Group& gr : groups_) total += gr.params.size();
    STRATA_CHECK(total > 0, "[{}] got an empty parameter list", this->name());
    validate_options(defaults_);
    for (size_t g = 0; g < groups_.size(); ++g) give_defaults(groups_[g], g);
    for (const Group& gr : groups_) validate_options(gr.options);
    check_params();
    mark_synced();
  }

  Group& group(size_t g) {
    STRATA_CHECK(g < groups_.size(), "[{}] param group {} out of range (the optimizer has {})", name(), g,
                 groups_.size());
    return groups_[g];
  }
  const Group& group(size_t g) const { return const_cast<OptimizerFor*>(this)->group(g); }
  /// The options group g's states were made under: those of the last step or load.
  const Options& synced_options(size_t g) const { return g < synced_.size() ? synced_[g] : group(g).options; }
  void mark_synced() override {
    synced_.clear();
    for (const Group& gr : groups_) synced_.push_back(gr.options);
  }

  void check_all_options() const override {
    for (const Group& gr : groups_) validate_options(gr.options);
  }
  void save_options(std::map<std::string, double>& scalars) const override {
    for (size_t g = 0; g < groups_.size(); ++g)
      Options::for_each_field(groups_[g].options, [&](const char* field, const auto& value) {
        scalars[group_key(g, field)] = static_cast<double>(value);
      });
  }
  void load_options(const std::map<std::string, double>& scalars) override {
    std::vector<Options> loaded;
    for (size_t g = 0; g < groups_.size(); ++g) {
      Options o = groups_[g].options;
      Options::for_each_field(o, [&](const char* field, auto& value) {
        auto it = scalars.find(group_key(g, field));
        STRATA_CHECK(it != scalars.end(), "[{}] load_state_dict: the state dict has no '{}'", name(),
                     group_key(g, field));
        using V = std::remove_reference_t<decltype(value)>;
        if constexpr (std::is_same_v<V, bool>)
          STRATA_CHECK(it->second == 0 || it->second == 1, "[{}] load_state_dict: '{}' is {}, not a bool (0 or 1)",
                       name(), it->first, it->second);
        else if constexpr (std::is_integral_v<V>)
          STRATA_CHECK(it->second > -9e18 && it->second < 9e18 &&
                           it->second == static_cast<double>(static_cast<int64_t>(it->second)),
                       "[{}] load_state_dict: '{}' is {}, not an integer", name(), it->first, it->second);
        value = static_cast<V>(it->second);
      });
      validate_options(o);
      loaded.push_back(o);
    }
    previous_.clear();
    for (size_t g = 0; g < groups_.size(); ++g) {
      previous_.push_back(groups_[g].options);
      groups_[g].options = loaded[g];
    }
  }
  void restore_options() override {
    for (size_t g = 0; g < previous_.size() && g < groups_.size(); ++g) groups_[g].options = previous_[g];
  }

 private:
  static constexpr bool kHasBetas = requires(Options o) { o.betas[0]; };
  static constexpr bool kHasMomentum = requires(Options o) { o.momentum; };
  static std::string group_key(size_t g, const char* field) {
    return "group." + std::to_string(g) + "." + field;
  }
  static std::vector<double> field_values(const Options& o) {
    std::vector<double> values;
    Options::for_each_field(o, [&](const char*, const auto& value) { values.push_back(static_cast<double>(value)); });
    return values;
  }
  void give_defaults(Group& group, size_t g) const {
    if (!group.takes_defaults) return;
    STRATA_CHECK(field_values(group.options) == field_values(Options{}),
                 "[{}] param group {} was made without options, so it takes the optimizer's defaults, but its "
                 "options were changed after; give them when making the group: {{params, options}}",
                 name(), g);
    group.options = defaults_;
    group.takes_defaults = false;
  }

  Options defaults_;
  std::vector<Group> groups_;
  std::vector<Options> previous_;
  std::vector<Options> synced_;  // by group; may be shorter than groups_ (see add_param_group)
};

}  // namespace strata::optim
