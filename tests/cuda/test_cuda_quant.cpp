// CUDA quantization kernels against the CPU's on fresh random inputs with odd sizes: codes,
// dequantized values, fake quant and its mask equal bit for bit (same float32 math); the int8
// GEMM exactly; the int8 and int4 Linear layers within float summation-order tolerance; the static
// int8 convolution, and a model calibrated and converted on the GPU against the same on the CPU;
// the dynamic int8 LSTM; the int8 Conv1d and ConvTranspose2d.
#include <cmath>
#include <vector>

#include "cuda/cuda_testing.h"
#include "testing.h"

namespace st = strata;
namespace q = strata::quant;
namespace ct = strata::cuda_testing;
using st::testing::all_close;
using st::testing::values;

TEST(CudaQuant, QuantizeDequantizeFakeQuantMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const st::Tensor x = ct::random({5, 37, 3}, st::kFloat32, -4, 4);
  const st::Tensor xc = x.cuda();
  for (st::DType dt : {st::kInt8, st::kUInt8}) {
    const q::QuantizedTensor a = q::quantize_per_tensor(x, 0.037, dt == st::kInt8 ? -3 : 120, dt);
    const q::QuantizedTensor b = q::quantize_per_tensor(xc, 0.037, dt == st::kInt8 ? -3 : 120, dt);
    EXPECT_EQ(values(a.int_repr), values(b.int_repr));
    EXPECT_EQ(values(a.dequantize()), values(b.dequantize()));
  }
  auto [lo, hi] = q::finite_aminmax(x, 1);
  auto [s, z] = q::calculate_qparams(lo, hi, q::quant_range(st::kInt8), false);
  EXPECT_EQ(values(q::quantize_per_channel(x, s, z, 1, st::kInt8).int_repr),
            values(q::quantize_per_channel(xc, s.cuda(), z.cuda(), 1, st::kInt8).int_repr));
  st::Tensor xg = x.clone().requires_grad_(true), xcg = xc.clone().requires_grad_(true);
  st::Tensor ya = q::fake_quantize_per_channel_affine(xg, s, z, 1, -128, 127);
  st::Tensor yb = q::fake_quantize_per_channel_affine(xcg, s.cuda(), z.cuda(), 1, -128, 127);
  EXPECT_EQ(values(ya), values(yb));
  ya.sum().backward();
  yb.sum().backward();
  EXPECT_EQ(values(xg.grad()), values(xcg.grad()));
}

TEST(CudaQuant, Int8GemmAndLinearMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  for (auto [M, K, N] : {std::tuple{7, 37, 13}, std::tuple{1, 300, 33}, std::tuple{64, 96, 17}}) {
    const st::Tensor a = st::randint(-128, 128, {M, K}).to(st::kInt8), b = st::randint(-128, 128, {K, N}).to(st::kInt8);
    EXPECT_EQ(values(q::int8_mm(a, b)), values(q::int8_mm(a.cuda(), b.cuda())));
    const st::Tensor x = ct::random({M, K}, st::kFloat32, -2, 3), w = ct::random({N, K}, st::kFloat32);
    const st::Tensor bias = ct::random({N}, st::kFloat32);
    const q::Int8Weight wc = q::quantize_weight_int8(w);
    const q::Int8Weight wg = q::quantize_weight_int8(w.cuda());
    EXPECT_EQ(values(wc.codes), values(wg.codes));
    EXPECT_TRUE(all_close(q::linear_int8_dynamic(x.cuda(), wg, bias.cuda()),
                          values(q::linear_int8_dynamic(x, wc, bias)), 1e-5, 1e-5));
  }
}

TEST(CudaQuant, Int4MatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const int64_t M = 9, K = 256, N = 21;
  const st::Tensor w = ct::random({N, K}, st::kFloat32), bias = ct::random({N}, st::kFloat32);
  for (bool symmetric : {true, false})
    for (int64_t g : {32, 128}) {
      const q::Int4Weight a = q::quantize_weight_int4(w, g, symmetric);
      const q::Int4Weight b = q::quantize_weight_int4(w.cuda(), g, symmetric);
      EXPECT_EQ(values(a.packed), values(b.packed));
      EXPECT_EQ(values(q::dequantize_weight_int4(a)), values(q::dequantize_weight_int4(b)));
      for (st::DType dt : {st::kFloat32, st::kBFloat16}) {
        const st::Tensor x = ct::random({M, K}, dt);
        const double tol = dt == st::kFloat32 ? 1e-4 : 2e-2;
        EXPECT_TRUE(all_close(q::linear_int4(x.cuda(), b, bias.to(dt).cuda()),
                              values(q::linear_int4(x, a, bias.to(dt))), tol, tol));
      }
    }
}

TEST(CudaQuant, StaticInt8ConvAndConvertedModelMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const st::nn::functional::Conv2dArgs args{.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}, .groups = 2};
  const st::Tensor x = ct::random({3, 4, 9, 7}, st::kFloat32, -2, 3), bias = ct::random({6}, st::kFloat32);
  const q::Int8Weight w = q::quantize_weight_int8(ct::random({6, 2 * 9}, st::kFloat32));
  const q::Int8Weight wg{w.codes.cuda(), w.scale.cuda()};
  // the same integer sums; the epilogue's float32 rounding may differ (a fused multiply-add)
  EXPECT_TRUE(all_close(q::conv2d_int8(x.cuda(), 0.02, 100, wg, {3, 3}, args, bias.cuda()),
                        values(q::conv2d_int8(x, 0.02, 100, w, {3, 3}, args, bias)), 1e-6, 1e-6));
  // a model calibrated and converted on the GPU computes what the same model does on the CPU
  auto make = [] {
    st::manual_seed(14);
    auto m = std::make_unique<st::nn::Sequential>(st::nn::Conv2d(4, 6, 3, {.padding = 1}), st::nn::ReLU(),
                                                  st::nn::Flatten(), st::nn::Linear(6 * 9 * 7, 5));
    m->eval();
    q::fuse_modules(*m, {{"0", "1"}});
    q::prepare(*m);
    return m;
  };
  auto cpu = make(), gpu = make();
  gpu->to(st::Device::cuda());
  (*cpu)(x);
  (*gpu)(x.cuda());
  q::convert(*cpu);
  q::convert(*gpu);
  // the requantized outputs hold the same codes but where the epilogue's last-bit difference (a fused
  // multiply-add) moves a value across a rounding boundary of either layer: then by one output step
  const double step = values(cpu->state_dict().at("3.quantized.output_scale"))[0];
  const std::vector<double> g = values((*gpu)(x.cuda())), c = values((*cpu)(x));
  ASSERT_EQ(g.size(), c.size());
  size_t same = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_LE(std::abs(g[i] - c[i]), step * 1.001) << i;
    same += std::abs(g[i] - c[i]) <= 1e-5 * std::abs(c[i]) + 1e-6;
  }
  EXPECT_GE(same, g.size() * 9 / 10);
}

// Conv1d and ConvTranspose2d converted on the CPU, then moved to the GPU: the same integer sums, the
// float32 epilogue and col2im sums within float rounding.
TEST(CudaQuant, StaticInt8Conv1dAndConvTranspose2dMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const st::nn::functional::ConvTranspose2dArgs args{.stride = 2, .padding = 1, .output_padding = 1, .groups = 2};
  const st::Tensor x = ct::random({3, 4, 5, 6}, st::kFloat32, -2, 3), bias = ct::random({6}, st::kFloat32);
  const q::Int8Weight w = q::quantize_weight_int8(ct::random({6, 2 * 9}, st::kFloat32));
  const q::Int8Weight wg{w.codes.cuda(), w.scale.cuda()};
  EXPECT_TRUE(all_close(q::conv_transpose2d_int8(x.cuda(), 0.02, 100, wg, {3, 3}, args, bias.cuda()),
                        values(q::conv_transpose2d_int8(x, 0.02, 100, w, {3, 3}, args, bias)), 1e-5, 1e-5));
  st::nn::Sequential model(st::nn::Conv1d(4, 6, 3, {.padding = 1, .groups = 2}), st::nn::ReLU());
  model.eval();
  q::fuse_modules(model, {{"0", "1"}});
  q::prepare(model);
  const st::Tensor seq = x.reshape({3, 4, 30});
  model(seq);
  q::convert(model);
  const std::vector<double> c = values(model(seq));
  model.to(st::Device::cuda());
  const double step = values(model.state_dict().at("0.0.quantized.output_scale"))[0];
  EXPECT_TRUE(all_close(model(seq.cuda()), c, 0, step * 1.001));
}

TEST(CudaQuant, RowwiseEmbeddingsMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const st::Tensor w = ct::random({23, 9}, st::kFloat32, -3, 2);
  const std::vector<int64_t> ids = {4, 22, 0, 0, 7, 13, 9, 1, 5, 5, 18};
  const st::Tensor idx = st::from_vector(ids), offsets = st::from_vector(std::vector<int64_t>{0, 2, 2, 7});
  const st::Tensor psw = ct::random({11}, st::kFloat32);
  for (int bits : {8, 4}) {
    const q::RowwiseWeight a = q::quantize_embedding_weight(w, bits), b = q::quantize_embedding_weight(w.cuda(), bits);
    EXPECT_EQ(values(a.codes), values(b.codes));
    EXPECT_EQ(values(a.scale), values(b.scale));
    EXPECT_EQ(values(q::dequantize_embedding_weight(a)), values(q::dequantize_embedding_weight(b)));
    EXPECT_EQ(values(q::embedding_rowwise(idx, a)), values(q::embedding_rowwise(idx.cuda(), b)));
    for (auto mode : {st::nn::EmbeddingBagMode::Sum, st::nn::EmbeddingBagMode::Mean, st::nn::EmbeddingBagMode::Max}) {
      const st::Tensor weights = mode == st::nn::EmbeddingBagMode::Sum ? psw : st::Tensor();
      const auto cpu = q::embedding_bag_rowwise(idx, a, {offsets, mode, weights, false, 5});
      const auto gpu = q::embedding_bag_rowwise(idx.cuda(), b,
                                                {offsets.cuda(), mode, weights.defined() ? weights.cuda() : weights,
                                                 false, 5});
      EXPECT_EQ(values(cpu), values(gpu));  // both reduce in float64 in index order
    }
    // indices out of range raise on the GPU too (checked on the host before the kernel reads a row)
    for (int64_t bad : {int64_t{23}, int64_t{-1}})
      EXPECT_TRUE(st::testing::throws_with(
          [&] { q::embedding_rowwise(st::from_vector(std::vector<int64_t>{0, bad}).cuda(), b); }, {"out of range"}));
  }
  // a row whose max - min overflows float32 is refused on the GPU as on the CPU
  st::Tensor wide = w.clone();
  wide.select(0, 3).select(0, 0).fill_(-3e38);
  wide.select(0, 3).select(0, 1).fill_(3e38);
  EXPECT_TRUE(st::testing::throws_with([&] { q::quantize_embedding_weight(wide.cuda(), 4); },
                                       {"row 3 spans more than float32 holds"}));
}

TEST(CudaQuant, DynamicInt8LstmMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  SEED_TRACE();
  const st::NoGradGuard no_grad;
  st::nn::LSTM cpu(7, 9, {.num_layers = 2, .bidirectional = true, .proj_size = 5});
  st::nn::LSTM gpu(7, 9, {.num_layers = 2, .bidirectional = true, .proj_size = 5});
  gpu.load_state_dict(cpu.state_dict());
  q::quantize_dynamic(cpu);
  q::quantize_dynamic(gpu);
  gpu.to(st::Device::cuda());
  const st::Tensor x = ct::random({6, 3, 7}, st::kFloat32, -2, 2);
  const st::nn::RNNOutput a = cpu.forward_with_state(x), b = gpu.forward_with_state(x.cuda());
  // the same codes (quantized on the CPU), float32 sums in another order: an activation code may
  // differ by one where a value lies at a rounding boundary, hence the loose tolerance
  EXPECT_TRUE(all_close(b.output.cpu(), values(a.output), 1e-3, 1e-3));
  EXPECT_TRUE(all_close(b.c_n.cpu(), values(a.c_n), 1e-3, 1e-3));
}
