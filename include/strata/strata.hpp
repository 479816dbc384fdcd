// The one header a strata program includes.
#pragma once

#include <strata/version.hpp>

#include <strata/core/allocator.hpp>
#include <strata/core/cuda.hpp>
#include <strata/core/cuda_graph.hpp>
#include <strata/core/device.hpp>
#include <strata/core/dtype.hpp>
#include <strata/core/error.hpp>
#include <strata/core/format.hpp>
#include <strata/core/generator.hpp>
#include <strata/core/registry.hpp>
#include <strata/core/scalar.hpp>
#include <strata/core/shape.hpp>
#include <strata/core/storage.hpp>
#include <strata/core/tensor.hpp>
#include <strata/core/threads.hpp>

#include <strata/autograd/autograd.hpp>
#include <strata/autograd/function.hpp>
#include <strata/autograd/grad_mode.hpp>
#include <strata/autograd/graph.hpp>

#include <strata/ops/advanced_index.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/compare.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/sort.hpp>
#include <strata/ops/statistics.hpp>
#include <strata/ops/unary.hpp>

#include <strata/nn/activation.hpp>
#include <strata/nn/attention.hpp>
#include <strata/nn/basic.hpp>
#include <strata/nn/batchnorm.hpp>
#include <strata/nn/containers.hpp>
#include <strata/nn/conv.hpp>
#include <strata/nn/dropout.hpp>
#include <strata/nn/embedding.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/functional_conv.hpp>
#include <strata/nn/functional_conv3d.hpp>
#include <strata/nn/functional_resample.hpp>
#include <strata/nn/hooks.hpp>
#include <strata/nn/init.hpp>
#include <strata/nn/instancenorm.hpp>
#include <strata/nn/linear.hpp>
#include <strata/nn/loss.hpp>
#include <strata/nn/module.hpp>
#include <strata/nn/normalization.hpp>
#include <strata/nn/parametrizations.hpp>
#include <strata/nn/parametrize.hpp>
#include <strata/nn/pooling.hpp>
#include <strata/nn/recurrent.hpp>
#include <strata/nn/resample.hpp>
#include <strata/nn/rnn_utils.hpp>
#include <strata/nn/transformer.hpp>

#include <strata/io/atomic_file.hpp>
#include <strata/io/checkpoint.hpp>
#include <strata/io/safetensors.hpp>

#include <strata/data/dataloader.hpp>
#include <strata/data/dataset.hpp>
#include <strata/data/datasets.hpp>
#include <strata/data/loader_state.hpp>
#include <strata/data/sampler.hpp>
#include <strata/data/token_shard.hpp>
#include <strata/data/idx.hpp>
#include <strata/data/image.hpp>
#include <strata/data/image_folder.hpp>
#include <strata/data/transforms.hpp>

#include <strata/amp/autocast.hpp>
#include <strata/amp/grad_scaler.hpp>

#include <strata/dist/ddp.hpp>
#include <strata/dist/ddp_comm_hooks.hpp>
#include <strata/dist/device_mesh.hpp>
#include <strata/dist/dtensor.hpp>
#include <strata/dist/dtensor_parallel.hpp>
#include <strata/dist/dtensor_state_dict.hpp>
#include <strata/dist/fsdp.hpp>
#include <strata/dist/pipeline.hpp>
#include <strata/dist/process_group.hpp>
#include <strata/dist/sharded_grad_scaler.hpp>
#include <strata/dist/tensor_parallel.hpp>
#include <strata/dist/vocab_parallel.hpp>
#include <strata/dist/zero.hpp>

#include <strata/memory/checkpoint.hpp>
#include <strata/memory/compress.hpp>

#include <strata/compress/depgraph.hpp>
#include <strata/compress/distill.hpp>
#include <strata/compress/heads.hpp>
#include <strata/compress/prune.hpp>
#include <strata/compress/shrink.hpp>
#include <strata/profiler/profiler.hpp>

#include <strata/quant/fake_quantize.hpp>
#include <strata/quant/fuse.hpp>
#include <strata/quant/learnable_fake_quantize.hpp>
#include <strata/quant/observer.hpp>
#include <strata/quant/qat.hpp>
#include <strata/quant/qembedding.hpp>
#include <strata/quant/qtensor.hpp>
#include <strata/quant/quantize.hpp>
#include <strata/quant/quantize_static.hpp>
#include <strata/quant/stubs.hpp>

#include <strata/optim/adadelta.hpp>
#include <strata/optim/adagrad.hpp>
#include <strata/optim/adam.hpp>
#include <strata/optim/adam8bit.hpp>
#include <strata/optim/adam_variants.hpp>
#include <strata/optim/clip.hpp>
#include <strata/optim/cyclic_lr.hpp>
#include <strata/optim/lamb.hpp>
#include <strata/optim/lbfgs.hpp>
#include <strata/optim/optimizer.hpp>
#include <strata/optim/rmsprop.hpp>
#include <strata/optim/scheduler.hpp>
#include <strata/optim/sgd.hpp>
#include <strata/optim/swa_utils.hpp>
