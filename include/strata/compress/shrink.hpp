// Physical structured pruning: removes output channels of a Conv2d or output features of a
// Linear, with the matching channels of a BatchNorm after it and the input channels of the
// layers that read them, so the network is smaller and faster, not just sparse.
//
//   compress::ChannelGroup block{&conv1, &bn1, {&conv2}};      // conv1 -> bn1 -> relu -> conv2
//   compress::ChannelGroup mlp{&layer.linear1, nullptr, {&layer.linear2}};  // transformer MLP
//   compress::prune_channels({block, mlp}, 0.3);  // the 30% least important channels of both
//   optim::AdamW opt(model.parameters(), ...);   // create optimizers after shrinking
//
// The layers are rebuilt in place: each parameter and buffer keeps its handle (Tensor::set_data)
// and takes a smaller value, and in/out sizes are updated. An optimizer made before shrinking
// holds state of the old shapes, so make it afterwards; gradients are cleared.
#pragma once

#include <cstdint>
#include <vector>

#include <strata/compress/prune.hpp>
#include <strata/nn/batchnorm.hpp>
#include <strata/nn/module.hpp>

namespace strata::compress {

/// Layers whose channels are removed together: the producer's output channels, the norm's
/// features and the consumers' input channels.
struct ChannelGroup {
  nn::Module* producer = nullptr;      // nn::Conv2d (groups 1) or nn::Linear
  nn::BatchNormBase* norm = nullptr;   // optional: normalizes the producer's output
  std::vector<nn::Module*> consumers;  // nn::Conv2d (groups 1) reading the channels, or nn::Linear
                                       // reading them (after global pooling, or flattened: then
                                       // in_features = channels * positions, NCHW order)
};

/// The producer's output channels.
STRATA_API int64_t num_channels(const ChannelGroup& group);
/// Raises Error naming the layer when the group is malformed: an unsupported layer, sizes that
/// do not chain, grouped convolutions, or a layer with a pruning mask (remove it first).
STRATA_API void check_group(const ChannelGroup& group);

struct ChannelSelection {
  Importance importance = Importance::L1;  // of the producer's weight per output channel
  int64_t min_channels = 1;                // each group keeps at least this many
  /// Optional scores, one tensor of num_channels per group, used instead of `importance`.
  std::vector<Tensor> scores;
};

/// The channels each group keeps (ascending) when the `amount` least important channels of
/// all the groups together are removed: one global ranking of the scores (raw, so give groups
/// comparable scores, or custom ones, when their scales differ), each group keeping at least
/// min_channels (a channel that would go below is passed over). Changes nothing.
STRATA_API std::vector<std::vector<int64_t>> select_channels(const std::vector<ChannelGroup>& groups, Amount amount,
                                                             const ChannelSelection& selection = {});

/// Mask pruning of the channels not in `keep`: masks the producer's weight rows and bias and the
/// norm's weight and bias (custom_from_mask), so those channels output zeros and, through an
/// activation with f(0) = 0, contribute nothing to the consumers: the network computes what
/// shrink_channels's would.
STRATA_API void mask_channels(const ChannelGroup& group, const std::vector<int64_t>& keep);
/// Rebuilds the group's layers with only the channels in `keep` (distinct, in range, not empty).
STRATA_API void shrink_channels(const ChannelGroup& group, const std::vector<int64_t>& keep);
/// select_channels, then shrink_channels on each group; returns what each group kept.
STRATA_API std::vector<std::vector<int64_t>> prune_channels(const std::vector<ChannelGroup>& groups, Amount amount,
                                                            const ChannelSelection& selection = {});

}  // namespace strata::compress
