// The strata side of tests/io/interop_safetensors.py.
//   helper dump FILE   prints one JSON object: the view's entries (dtype, shape, bytes as
//                      hex), and either the loaded tensors' values or the load error
//   helper write DIR   writes DIR/strata_all.safetensors (every numpy-representable strata
//                      dtype, strided inputs, 0-d and empty tensors, metadata) and
//                      DIR/strata_bf16.safetensors, with values from formulas the script
//                      computes on its own
//   helper write_odd_names DIR   writes DIR/odd_names.safetensors (control bytes in a name
//                      and in metadata)
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <strata/strata.hpp>

namespace st = strata;

namespace {

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string values_json(const st::Tensor& t) {
  std::vector<std::string> items;
  if (st::is_floating(t.dtype())) {
    st::Tensor d = t.to(st::kFloat64).contiguous();
    for (int64_t i = 0; i < d.numel(); ++i) items.push_back(fmt::format("{:.17g}", d.data_ptr<double>()[i]));
  } else {
    st::Tensor d = t.to(st::kInt64).contiguous();
    for (int64_t i = 0; i < d.numel(); ++i) items.push_back(fmt::format("{}", d.data_ptr<int64_t>()[i]));
  }
  return fmt::format("[{}]", fmt::join(items, ","));
}

int dump(const std::string& path) {
  st::io::SafetensorsView view = st::io::view_safetensors_file(path);
  std::vector<std::string> entries;
  for (const auto& e : view.entries) {
    std::string hex;
    for (uint64_t i = 0; i < e.nbytes(); ++i) hex += fmt::format("{:02x}", e.data[i]);
    entries.push_back(fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"hex\":\"{}\"}}", quoted(e.name), e.dtype,
                                  fmt::join(e.shape, ","), hex));
  }
  std::vector<std::string> meta;
  for (const auto& [k, v] : view.metadata) meta.push_back(quoted(k) + ":" + quoted(v));
  std::string loaded;
  try {
    st::io::SafetensorsFile f = st::io::load_safetensors(path);
    std::vector<std::string> items;
    for (const auto& [name, t] : f.tensors)
      items.push_back(fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"values\":{}}}", quoted(name),
                                  st::dtype_name(t.dtype()), fmt::join(t.shape(), ","), values_json(t)));
    loaded = fmt::format("\"tensors\":{{{}}}", fmt::join(items, ","));
  } catch (const st::Error& e) {
    loaded = "\"load_error\":" + quoted(e.what());
  }
  fmt::print("{{\"entries\":{{{}}},\"metadata\":{{{}}},{}}}\n", fmt::join(entries, ","), fmt::join(meta, ","), loaded);
  return 0;
}

// The script's formulas: f(i) over the flat index of a (3, 4) tensor, per dtype.
st::Tensor formula(st::DType dtype) {
  std::vector<double> v(12);
  for (int i = 0; i < 12; ++i) {
    if (dtype == st::kBool) v[i] = i % 3 == 0;
    else if (dtype == st::kUInt8) v[i] = (i * 21) % 256;
    else if (st::is_floating(dtype)) v[i] = (i - 5.5) * 0.25;
    else if (dtype == st::kInt64) v[i] = ((i * 37) % 23 - 11) * 1e12;
    else v[i] = (i * 37) % 23 - 11;
  }
  return st::from_vector(v, st::Shape{3, 4}).to(dtype);
}

int write(const std::string& dir) {
  st::io::TensorMap m;
  for (st::DType d : {st::kBool, st::kUInt8, st::kInt8, st::kInt32, st::kInt64, st::kFloat16, st::kFloat32,
                      st::kFloat64}) {
    std::string name(st::dtype_name(d));
    m[name] = formula(d);
    m[name + ".T"] = formula(d).t();  // a strided view
  }
  m["scalar"] = st::scalar_tensor(2.5, st::kFloat64);
  m["empty"] = st::zeros({0, 3}, st::kInt32);
  st::io::save_safetensors(dir + "/strata_all.safetensors", m, {{"written_by", "strata"}});
  st::io::save_safetensors(dir + "/strata_bf16.safetensors", {{"bf16", formula(st::kBFloat16)}});
  return 0;
}

// A tensor name and a metadata value with control bytes (a newline, a terminal escape) and a
// backslash, for strata-inspect's escaping.
int write_odd_names(const std::string& dir) {
  st::io::save_safetensors(dir + "/odd_names.safetensors", {{"two\nlines", st::ones({2})}},
                           {{"note", "a\x1b[31mred\\b"}});
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s dump FILE | write DIR | write_odd_names DIR\n", argv[0]);
    return 2;
  }
  try {
    std::string mode = argv[1];
    if (mode == "dump") return dump(argv[2]);
    if (mode == "write") return write(argv[2]);
    if (mode == "write_odd_names") return write_odd_names(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 2;
}
