// Quantized Linear layers beside the float32 one: for each shape (batch M, in K, out N) the
// median time of a float32 nn::Linear, the same layer after quant::quantize_dynamic to int8
// (dynamic per-row activations) and to int4 (weight only, group 128; "i4deq" the same layer with
// quant::set_int4_direct_kernel(false), which dequantizes tiles for the float GEMM at every row
// count), in interleaved rounds so
// all three see the same machine noise; the table gives each time and its ratio to float32
// (above 1: faster than float32), and the weight bytes each form keeps. A second table times a
// float32 Conv2d (oneDNN) against the same layer after static quantization (quant::prepare, one
// calibration batch, quant::convert: uint8 codes, oneDNN's int8 convolution, requantized output),
// and against that layer with quant::set_onednn_int8_conv(false) (im2col and the int8 GEMM, the
// reference path). A third times a float32 nn::EmbeddingBag (sum of bags of 20 rows) against the
// same table row-wise quantized to uint8 and to 4 bits (quantize_dynamic's embeddings). A fourth
// times a float32 nn::LSTM over a sequence against the same layer with dynamic int8 weights (each
// step's activations quantized per row) and with float16 weights. A fifth times float32 Conv1d and
// ConvTranspose2d layers against the same layers statically quantized to int8.
//
//   bench_quant [--rounds R] [--table linear|conv|embedding|lstm|conv1d]   STRATA_BENCH_THREADS: threads
//   (default 2)
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <strata/strata.hpp>

#include "machine.h"

namespace {

namespace st = strata;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// seconds per call of layer(x), over enough calls to last about 0.25 s (coarse clocks on some VMs)
double time_once(st::nn::Module& layer, const st::Tensor& x) {
  int calls = 1;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) layer(x);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0.25 || calls > (1 << 20)) return s / calls;
    calls *= 2;
  }
}

int64_t state_bytes(const st::nn::Module& m) {
  int64_t b = 0;
  for (const auto& [name, t] : m.state_dict()) b += t.numel() * static_cast<int64_t>(st::itemsize(t.dtype()));
  return b;
}

void conv_table(int rounds) {
  fmt::print("\nstatic int8 Conv2d (3x3, padding 1) vs float32 Conv2d\n");
  fmt::print("{:>4} {:>4} {:>4} {:>4} | {:>10} {:>10} {:>10} | {:>9} {:>9}\n", "N", "C", "HW", "out", "f32 us",
             "int8 us", "im2col us", "int8 x", "im2col x");
  const std::vector<std::array<int64_t, 4>> shapes = {
      {1, 64, 56, 64}, {8, 64, 28, 128}, {32, 32, 16, 32}, {4, 128, 28, 128}, {1, 256, 14, 256}};
  for (auto [N, C, HW, out] : shapes) {
    st::manual_seed(0);
    st::nn::Conv2d f32(C, out, 3, {.padding = 1}), i8(C, out, 3, {.padding = 1});
    i8.load_state_dict(f32.state_dict());
    const st::Tensor x = st::randn({N, C, HW, HW});
    st::NoGradGuard no_grad;
    st::quant::prepare(i8);
    i8(x);
    st::quant::convert(i8);
    f32(x);
    i8(x);  // warm-up
    std::vector<double> tf, t8, tr;
    for (int r = 0; r < rounds; ++r) {
      tf.push_back(time_once(f32, x));
      t8.push_back(time_once(i8, x));
      st::quant::set_onednn_int8_conv(false);
      tr.push_back(time_once(i8, x));
      st::quant::set_onednn_int8_conv(true);
    }
    const double f = median(tf), a = median(t8), b = median(tr);
    fmt::print("{:>4} {:>4} {:>4} {:>4} | {:>10.1f} {:>10.1f} {:>10.1f} | {:>9.2f} {:>9.2f}\n", N, C, HW, out, f * 1e6,
               a * 1e6, b * 1e6, f / a, f / b);
  }
}

// One row: a float32 layer against a copy of it statically quantized (prepare, one calibration
// batch, convert), median times over interleaved rounds.
template <class Make>
void static_row(const std::string& label, const Make& make, const st::Tensor& x, int rounds) {
  st::manual_seed(0);
  auto f32 = make(), i8 = make();
  i8->load_state_dict(f32->state_dict());
  st::NoGradGuard no_grad;
  st::quant::prepare(*i8);
  (*i8)(x);
  st::quant::convert(*i8);
  (*f32)(x);
  (*i8)(x);  // warm-up
  std::vector<double> tf, t8;
  for (int r = 0; r < rounds; ++r) {
    tf.push_back(time_once(*f32, x));
    t8.push_back(time_once(*i8, x));
  }
  const double f = median(tf), a = median(t8);
  fmt::print("{:<58} | {:>10.1f} {:>10.1f} | {:>7.2f}\n", label, f * 1e6, a * 1e6, f / a);
}

void conv1d_transpose_table(int rounds) {
  namespace nn = st::nn;
  fmt::print("\nstatic int8 Conv1d and ConvTranspose2d vs float32\n");
  fmt::print("{:<58} | {:>10} {:>10} | {:>7}\n", "layer (input)", "f32 us", "int8 us", "int8 x");
  for (auto [N, C, L, out, k] : std::vector<std::array<int64_t, 5>>{
           {8, 64, 1024, 64, 3}, {32, 128, 256, 128, 5}, {1, 256, 4096, 256, 3}}) {
    const auto make = [&] { return std::make_unique<nn::Conv1d>(C, out, k, nn::Conv1dOptions{.padding = k / 2}); };
    static_row(fmt::format("Conv1d({}, {}, {}, pad {}) ({} x {} x {})", C, out, k, k / 2, N, C, L), make,
               st::randn({N, C, L}), rounds);
  }
  for (auto [N, C, HW, out, k] : std::vector<std::array<int64_t, 5>>{
           {8, 64, 14, 32, 4}, {4, 128, 28, 64, 2}, {1, 256, 7, 128, 4}}) {
    const int64_t pad = k == 4 ? 1 : 0;
    const auto make = [&] {
      return std::make_unique<nn::ConvTranspose2d>(C, out, k, nn::ConvTranspose2dOptions{.stride = 2, .padding = pad});
    };
    static_row(fmt::format("ConvTranspose2d({}, {}, {}, s 2, pad {}) ({} x {} x {}^2)", C, out, k, pad, N, C, HW),
               make, st::randn({N, C, HW, HW}), rounds);
  }
}

void embedding_table(int rounds) {
  fmt::print("\nrow-wise quantized EmbeddingBag (sum, bags of 20) vs float32 EmbeddingBag\n");
  fmt::print("{:>7} {:>4} {:>5} | {:>10} {:>10} {:>10} | {:>9} {:>9} | {:>8} {:>8} {:>8}\n", "rows", "dim", "bags",
             "f32 us", "uint8 us", "uint4 us", "uint8 x", "uint4 x", "f32 KiB", "u8 KiB", "u4 KiB");
  const std::vector<std::array<int64_t, 3>> shapes = {{10000, 32, 256}, {100000, 64, 4096}, {200000, 128, 1024}};
  for (auto [rows, dim, bags] : shapes) {
    namespace q = st::quant;
    st::manual_seed(0);
    const st::nn::EmbeddingBagOptions sum{.mode = st::nn::EmbeddingBagMode::Sum};
    st::nn::EmbeddingBag f32(rows, dim, sum), u8(rows, dim, sum), u4(rows, dim, sum);
    u8.load_state_dict(f32.state_dict());
    u4.load_state_dict(f32.state_dict());
    q::quantize_dynamic(u8, {.embeddings = q::EmbeddingDtype::UInt8});
    q::quantize_dynamic(u4, {.embeddings = q::EmbeddingDtype::UInt4});
    const st::Tensor ids = st::randint(0, rows, {bags, 20});  // a bag per row
    st::NoGradGuard no_grad;
    std::vector<double> tf, t8, t4;
    for (int r = 0; r < rounds; ++r) {
      tf.push_back(time_once(f32, ids));
      t8.push_back(time_once(u8, ids));
      t4.push_back(time_once(u4, ids));
    }
    const double f = median(tf), a = median(t8), b = median(t4);
    fmt::print("{:>7} {:>4} {:>5} | {:>10.1f} {:>10.1f} {:>10.1f} | {:>9.2f} {:>9.2f} | {:>8} {:>8} {:>8}\n", rows, dim,
               bags, f * 1e6, a * 1e6, b * 1e6, f / a, f / b, state_bytes(f32) / 1024, state_bytes(u8) / 1024,
               state_bytes(u4) / 1024);
  }
}

void lstm_table(int rounds) {
  namespace q = st::quant;
  fmt::print("\ndynamic int8 / float16 LSTM vs float32 LSTM (input_size = hidden_size)\n");
  fmt::print("{:>4} {:>5} {:>6} | {:>10} {:>10} {:>10} | {:>9} {:>9} | {:>8} {:>8}\n", "seq", "batch", "hidden",
             "f32 ms", "int8 ms", "fp16 ms", "int8 x", "fp16 x", "f32 KiB", "int8 KiB");
  const std::vector<std::array<int64_t, 3>> shapes = {{64, 16, 512}, {64, 16, 1024}, {64, 1, 1024}};
  for (auto [L, N, H] : shapes) {
    st::manual_seed(0);
    st::nn::LSTM f32(H, H), i8(H, H), f16(H, H);
    i8.load_state_dict(f32.state_dict());
    f16.load_state_dict(f32.state_dict());
    q::quantize_dynamic(i8);
    q::quantize_dynamic(f16, {.recurrent = q::RecurrentDtype::Float16});
    const st::Tensor x = st::randn({L, N, H});
    st::NoGradGuard no_grad;
    for (auto* l : {&f32, &i8, &f16}) (*l)(x);  // warm-up
    std::vector<double> tf, t8, th;
    for (int r = 0; r < rounds; ++r) {
      tf.push_back(time_once(f32, x));
      t8.push_back(time_once(i8, x));
      th.push_back(time_once(f16, x));
    }
    const double f = median(tf), a = median(t8), b = median(th);
    fmt::print("{:>4} {:>5} {:>6} | {:>10.2f} {:>10.2f} {:>10.2f} | {:>9.2f} {:>9.2f} | {:>8} {:>8}\n", L, N, H,
               f * 1e3, a * 1e3, b * 1e3, f / a, f / b, state_bytes(f32) / 1024, state_bytes(i8) / 1024);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* env = std::getenv("STRATA_BENCH_THREADS");
  const int threads = env ? std::atoi(env) : 2;
  bench::restart_with_bench_env(argv, threads);
  st::set_num_threads(threads);
  int rounds = 7;
  std::string table;  // empty: every table
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--rounds") rounds = std::atoi(argv[i + 1]);
    if (std::string(argv[i]) == "--table") table = argv[i + 1];
  }
  if (table == "conv" || table == "embedding" || table == "lstm" || table == "conv1d") {  // that table alone
    (table == "conv"        ? conv_table
     : table == "embedding" ? embedding_table
     : table == "lstm"      ? lstm_table
                            : conv1d_transpose_table)(rounds);
    return 0;
  }
  if (!table.empty() && table != "linear") {
    fmt::print(stderr, "unknown --table {} (linear, conv, embedding, lstm or conv1d)\n", table);
    return 2;
  }
  fmt::print("quantized Linear vs float32 Linear, {} threads, {} rounds, CPU {}\n", threads, rounds,
             bench::cpu_model());
  fmt::print("{:>5} {:>5} {:>5} | {:>10} {:>10} {:>10} {:>10} | {:>9} {:>9} {:>9} | {:>8} {:>8} {:>8}\n", "M", "K",
             "N", "f32 us", "int8 us", "int4 us", "i4deq us", "int8 x", "int4 x", "i4deq x", "f32 KiB", "int8 KiB",
             "int4 KiB");
  const std::vector<std::array<int64_t, 3>> shapes = {
      {1, 1024, 1024}, {1, 4096, 4096}, {16, 1024, 1024}, {16, 4096, 4096}, {128, 1024, 1024}, {512, 1024, 4096}};
  for (auto [M, K, N] : shapes) {
    st::manual_seed(0);
    st::nn::Linear f32(K, N), i8(K, N), i4(K, N);
    i8.load_state_dict(f32.state_dict());
    i4.load_state_dict(f32.state_dict());
    st::quant::quantize_dynamic(i8);
    st::quant::quantize_dynamic(i4, {.dtype = st::quant::WeightDtype::Int4, .group_size = 128});
    const st::Tensor x = st::randn({M, K});
    st::NoGradGuard no_grad;
    for (auto* l : {&f32, &i8, &i4}) (*l)(x);  // warm-up
    std::vector<double> tf, t8, t4, td;
    for (int r = 0; r < rounds; ++r) {
      tf.push_back(time_once(f32, x));
      t8.push_back(time_once(i8, x));
      t4.push_back(time_once(i4, x));
      st::quant::set_int4_direct_kernel(false);
      td.push_back(time_once(i4, x));
      st::quant::set_int4_direct_kernel(true);
    }
    const double f = median(tf), a = median(t8), b = median(t4), d = median(td);
    fmt::print("{:>5} {:>5} {:>5} | {:>10.1f} {:>10.1f} {:>10.1f} {:>10.1f} | {:>9.2f} {:>9.2f} {:>9.2f} | {:>8} {:>8} "
               "{:>8}\n", M, K, N, f * 1e6, a * 1e6, b * 1e6, d * 1e6, f / a, f / b, f / d, state_bytes(f32) / 1024,
               state_bytes(i8) / 1024, state_bytes(i4) / 1024);
  }
  if (table == "linear") return 0;
  conv_table(rounds);
  embedding_table(rounds);
  lstm_table(rounds);
  conv1d_transpose_table(rounds);
}
