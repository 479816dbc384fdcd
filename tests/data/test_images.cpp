// Image decoding against independently encoded JPEG/PNG files (libpng's writer, TurboJPEG's
// compressor), rejection of corrupt, truncated and oversized files, ImageFolder's scan and
// samples, and SyntheticImageDataset.
#include <sys/resource.h>

#include <chrono>
#include <random>
#include <thread>

#include <zlib.h>

#include "data/image_encode.h"
#include "testing.h"

namespace st = strata;
namespace sd = strata::data;
using namespace strata::testing;

namespace {

std::vector<uint8_t> random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Expects `f` to raise strata::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::vector<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no error raised";
  } catch (const st::Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

long max_rss_kb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

void put_be32(std::vector<uint8_t>& b, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}

}  // namespace

TEST(ImageDecode, PngRgb8Exact) {
  auto px = random_bytes(7 * 5 * 3, 1);
  sd::Image img = sd::decode_png(encode_png({.width = 7, .height = 5}, px));
  ASSERT_EQ(img.height, 5);
  ASSERT_EQ(img.width, 7);
  EXPECT_EQ(img.pixels, px);
}

TEST(ImageDecode, PngInterlacedExact) {
  auto px = random_bytes(13 * 11 * 3, 2);
  sd::Image img = sd::decode_png(encode_png({.width = 13, .height = 11, .interlaced = true}, px));
  EXPECT_EQ(img.pixels, px);
}

TEST(ImageDecode, PngGrayAndAlphaConvertToRgb) {
  auto g = random_bytes(6 * 4, 3);
  sd::Image gray = sd::decode_png(encode_png({.width = 6, .height = 4, .color_type = PNG_COLOR_TYPE_GRAY}, g));
  auto rgba = random_bytes(6 * 4 * 4, 4);
  sd::Image noalpha = sd::decode_png(encode_png({.width = 6, .height = 4, .color_type = PNG_COLOR_TYPE_RGBA}, rgba));
  // 4-bit grey: two pixels a byte, values v in 0..15 expand to v * 17
  std::vector<uint8_t> g4 = random_bytes(3 * 4, 5);
  sd::Image gray4 =
      sd::decode_png(encode_png({.width = 6, .height = 4, .color_type = PNG_COLOR_TYPE_GRAY, .bit_depth = 4}, g4));
  for (int i = 0; i < 24; ++i)
    for (int c = 0; c < 3; ++c) {
      ASSERT_EQ(gray.pixels[i * 3 + c], g[i]) << i;
      ASSERT_EQ(noalpha.pixels[i * 3 + c], rgba[i * 4 + c]) << i;
      int nibble = (i % 2 == 0) ? g4[i / 2] >> 4 : g4[i / 2] & 15;
      ASSERT_EQ(gray4.pixels[i * 3 + c], nibble * 17) << i;
    }
}

TEST(ImageDecode, PngPaletteWithTransparency) {
  PngSpec spec{.width = 5, .height = 3, .color_type = PNG_COLOR_TYPE_PALETTE};
  for (int k = 0; k < 4; ++k)
    spec.palette.push_back(png_color{uint8_t(10 + k), uint8_t(100 + k * 30), uint8_t(250 - k * 50)});
  spec.trns = {0, 128, 255, 7};
  std::vector<uint8_t> idx(15);
  for (int i = 0; i < 15; ++i) idx[i] = static_cast<uint8_t>((i * 7) % 4);
  sd::Image img = sd::decode_png(encode_png(spec, idx));
  for (int i = 0; i < 15; ++i) {
    const png_color& p = spec.palette[idx[i]];
    EXPECT_EQ(img.pixels[i * 3 + 0], p.red);
    EXPECT_EQ(img.pixels[i * 3 + 1], p.green);
    EXPECT_EQ(img.pixels[i * 3 + 2], p.blue);
  }
}

TEST(ImageDecode, Png16BitScalesWithRounding) {
  // RGB 16-bit and grey+alpha 16-bit; the reference is round(v * 255 / 65535)
  const int w = 9, h = 4;
  std::vector<uint8_t> rgb16 = random_bytes(w * h * 3 * 2, 6), ga16 = random_bytes(w * h * 2 * 2, 7);
  sd::Image rgb = sd::decode_png(encode_png({.width = w, .height = h, .bit_depth = 16}, rgb16));
  sd::Image ga = sd::decode_png(
      encode_png({.width = w, .height = h, .color_type = PNG_COLOR_TYPE_GRAY_ALPHA, .bit_depth = 16}, ga16));
  auto scale = [](const std::vector<uint8_t>& b, size_t i) {
    return static_cast<int>(std::lround((b[2 * i] * 256 + b[2 * i + 1]) * 255.0 / 65535.0));
  };
  for (int i = 0; i < w * h; ++i)
    for (int c = 0; c < 3; ++c) {
      ASSERT_EQ(rgb.pixels[i * 3 + c], scale(rgb16, i * 3 + c)) << i;
      ASSERT_EQ(ga.pixels[i * 3 + c], scale(ga16, i * 2)) << i;
    }
}

TEST(ImageDecode, JpegFlatQuality100AndSmoothImage) {
  std::vector<uint8_t> flat(16 * 24 * 3);
  for (size_t i = 0; i < flat.size(); i += 3) flat[i] = 200, flat[i + 1] = 40, flat[i + 2] = 90;
  sd::Image f = sd::decode_jpeg(encode_jpeg(flat, 24, 16, 100));
  ASSERT_EQ(f.height, 16);
  ASSERT_EQ(f.width, 24);
  for (size_t i = 0; i < flat.size(); ++i) ASSERT_NEAR(f.pixels[i], flat[i], 1) << i;
  // a smooth gradient at quality 95: every pixel within a few levels
  const int W = 40, H = 30;
  std::vector<uint8_t> grad(W * H * 3);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      uint8_t* p = &grad[(y * W + x) * 3];
      p[0] = static_cast<uint8_t>(x * 6), p[1] = static_cast<uint8_t>(y * 8), p[2] = static_cast<uint8_t>(128);
    }
  sd::Image g = sd::decode_image(encode_jpeg(grad, W, H, 95));
  double err = 0;
  for (size_t i = 0; i < grad.size(); ++i) {
    ASSERT_NEAR(g.pixels[i], grad[i], 8) << i;
    err += std::abs(g.pixels[i] - grad[i]);
  }
  EXPECT_LT(err / grad.size(), 1.5);
}

TEST(ImageDecode, JpegCmykInvertedAsAdobeWritesIt) {
  // stored (inverted) CMYK: with K' = 255 (no black ink) RGB equals C'M'Y'; K' = 128 halves it
  for (uint8_t k : {uint8_t{255}, uint8_t{128}}) {
    std::vector<uint8_t> cmyk(16 * 16 * 4);
    for (size_t i = 0; i < cmyk.size(); i += 4) cmyk[i] = 200, cmyk[i + 1] = 100, cmyk[i + 2] = 50, cmyk[i + 3] = k;
    tjhandle h = tjInitCompress();
    unsigned char* buf = nullptr;
    unsigned long size = 0;
    ASSERT_EQ(tjCompress2(h, cmyk.data(), 16, 0, 16, TJPF_CMYK, &buf, &size, TJSAMP_444, 100, 0), 0);
    std::vector<uint8_t> jpg(buf, buf + size);
    tjFree(buf);
    tjDestroy(h);
    sd::Image img = sd::decode_jpeg(jpg);
    for (int i = 0; i < 256; ++i)
      for (int c = 0; c < 3; ++c) ASSERT_NEAR(img.pixels[i * 3 + c], cmyk[c] * k / 255.0, 2) << i;
  }
}

TEST(ImageDecode, TruncatedAndCorruptFilesNameTheFile) {
  TempDir dir;
  auto png = encode_png({.width = 32, .height = 32}, random_bytes(32 * 32 * 3, 8));
  auto jpg = encode_jpeg(random_bytes(32 * 32 * 3, 9), 32, 32, 90);
  write_bytes(dir / "half.png", std::vector<uint8_t>(png.begin(), png.begin() + png.size() / 2));
  write_bytes(dir / "half.jpg", std::vector<uint8_t>(jpg.begin(), jpg.begin() + jpg.size() / 2));
  auto bad_png = png;
  bad_png[png.size() / 2] ^= 0x5A;  // inside IDAT: its CRC no longer matches
  write_bytes(dir / "flipped.png", bad_png);
  write_bytes(dir / "text.png", {'h', 'e', 'l', 'l', 'o'});
  write_bytes(dir / "empty.jpg", {});
  for (const char* name : {"half.png", "half.jpg", "flipped.png", "text.png", "empty.jpg"})
    expect_error([&] { sd::read_image(dir / name); }, {dir / name});
  expect_error([&] { sd::read_image(dir / "missing.png"); }, {"cannot open", dir / "missing.png"});
}

TEST(ImageDecode, HugeDeclaredSizeRejectedBeforeAllocating) {
  TempDir dir;
  // PNG: IHDR width/height at bytes 16..23, its CRC (over type + data) at 29..32
  auto png = encode_png({.width = 4, .height = 4}, random_bytes(48, 10));
  put_be32(png, 16, 100000);
  put_be32(png, 20, 100000);
  put_be32(png, 29, static_cast<uint32_t>(crc32(0, png.data() + 12, 17)));
  write_bytes(dir / "huge.png", png);
  // JPEG: the SOF0 segment FF C0 len(2) precision(1) height(2) width(2); 60000 fits 16 bits
  auto jpg = encode_jpeg(random_bytes(48, 11), 4, 4, 90);
  size_t sof = 0;
  for (size_t i = 2; i + 1 < jpg.size(); ++i)
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xC0) { sof = i; break; }
  ASSERT_GT(sof, 0u);
  jpg[sof + 5] = jpg[sof + 7] = 0xEA, jpg[sof + 6] = jpg[sof + 8] = 0x60;
  write_bytes(dir / "huge.jpg", jpg);
  const long rss_before = max_rss_kb();
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { sd::read_image(dir / "huge.png"); }, {dir / "huge.png", "100000x100000", "exceeds the limit"});
  expect_error([&] { sd::read_image(dir / "huge.jpg"); }, {dir / "huge.jpg", "60000x60000", "exceeds the limit"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  EXPECT_LT(max_rss_kb() - rss_before, 64 * 1024);  // tens of GiB were declared
}

// A progressive 8x8 greyscale JPEG of mid-grey (every coefficient 0), built by hand with
// `refinements` successive-approximation passes over the DC and each of the 63 AC
// coefficients: 64 * (1 + refinements) scans, a valid progression however many there are.
// Both Huffman tables hold one 1-bit code, symbol 0 (DC category 0, AC end of band), so each
// scan's data is a single 0 bit (a DC refinement: its raw bit) padded with 1s.
std::vector<uint8_t> progressive_grey_jpeg(int refinements) {
  std::vector<uint8_t> b = {0xFF, 0xD8};
  auto segment = [&b](uint8_t marker, std::vector<uint8_t> body) {
    const size_t len = body.size() + 2;
    b.insert(b.end(), {0xFF, marker, static_cast<uint8_t>(len >> 8), static_cast<uint8_t>(len)});
    b.insert(b.end(), body.begin(), body.end());
  };
  std::vector<uint8_t> dqt(65, 1);
  dqt[0] = 0;  // 8-bit table 0, every step 1
  segment(0xDB, dqt);
  segment(0xC2, {8, 0, 8, 0, 8, 1, 1, 0x11, 0});  // progressive, 8x8, one component (id 1)
  std::vector<uint8_t> one_code(17, 0);
  one_code[1] = 1;           // one code of length 1
  one_code.push_back(0);     // its symbol
  one_code[0] = 0x00;        // DC table 0
  segment(0xC4, one_code);
  one_code[0] = 0x10;        // AC table 0
  segment(0xC4, one_code);
  auto scan = [&](uint8_t ss, uint8_t se, uint8_t ah, uint8_t al) {
    segment(0xDA, {1, 1, 0x00, ss, se, static_cast<uint8_t>(ah << 4 | al)});
    b.push_back(0x7F);
  };
  const uint8_t top = static_cast<uint8_t>(refinements);
  for (int k = 0; k < 64; ++k) scan(k, k, 0, top);  // first scans: the high bits
  for (int al = top - 1; al >= 0; --al)
    for (int k = 0; k < 64; ++k) scan(k, k, static_cast<uint8_t>(al + 1), static_cast<uint8_t>(al));
  b.insert(b.end(), {0xFF, 0xD9});
  return b;
}

// A progressive JPEG can ask for thousands of passes over every coefficient (a file of a few
// kilobytes costing minutes to decode); past TurboJPEG's limit of 500 scans it is refused.
TEST(ImageDecode, ProgressiveJpegScansAreLimited) {
  const std::vector<uint8_t> few = progressive_grey_jpeg(3);  // 256 scans: decodes
  const sd::Image image = sd::decode_jpeg(few, "few.jpg");
  ASSERT_EQ(image.height, 8);
  ASSERT_EQ(image.width, 8);
  for (uint8_t v : image.pixels) EXPECT_EQ(v, 128);
  const std::vector<uint8_t> many = progressive_grey_jpeg(9);  // 640 scans
  expect_error([&] { sd::decode_jpeg(many, "many.jpg"); }, {"many.jpg", "500 scans"});
}

TEST(ImageFolder, ClassesSamplesAndDecoding) {
  TempDir dir;
  auto px = [](int seed) { return random_bytes(6 * 4 * 3, seed); };
  write_bytes(dir / "cat/b.png", encode_png({.width = 6, .height = 4}, px(1)));
  write_bytes(dir / "cat/a.JPG", encode_jpeg(px(2), 6, 4, 90));
  write_bytes(dir / "cat/notes.txt", {'x'});
  write_bytes(dir / "dog/sub/c.jpeg", encode_jpeg(px(3), 6, 4, 90));
  write_bytes(dir / "ant/x.Png", encode_png({.width = 6, .height = 4}, px(4)));
  sd::ImageFolder ds(dir.str());
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"ant", "cat", "dog"}));
  EXPECT_EQ(ds.class_to_idx().at("dog"), 2);
  ASSERT_EQ(ds.size(), 4);
  std::vector<std::pair<std::string, int64_t>> want = {
      {dir / "ant/x.Png", 0}, {dir / "cat/a.JPG", 1}, {dir / "cat/b.png", 1}, {dir / "dog/sub/c.jpeg", 2}};
  EXPECT_EQ(ds.samples(), want);
  sd::Example e = ds.get(2);
  ASSERT_EQ(e.input.shape(), (st::Shape{4, 6, 3}));
  ASSERT_EQ(e.input.dtype(), st::kUInt8);
  auto b = px(1);
  EXPECT_EQ(std::vector<uint8_t>(e.input.data_ptr<uint8_t>(), e.input.data_ptr<uint8_t>() + 72), b);
  EXPECT_EQ(e.target.dtype(), st::kInt64);
  EXPECT_EQ(e.target.dim(), 0);
  EXPECT_EQ(e.target.item<int64_t>(), 1);
  EXPECT_THROW(ds.get(4), st::Error);
  EXPECT_THROW(ds.get(-1), st::Error);
}

TEST(ImageFolder, AugmentationIsPerIndexNotPerThread) {
  TempDir dir;
  for (int i = 0; i < 6; ++i)
    write_bytes(dir / fmt::format("c{}/{}.png", i % 2, i), encode_png({.width = 20, .height = 16}, random_bytes(960, i)));
  sd::Compose tf({sd::RandomResizedCrop(8), sd::RandomHorizontalFlip(), sd::ToTensor()});
  sd::ImageFolder ds(dir.str(), tf, 42);
  std::vector<std::vector<double>> serial;
  for (int64_t i = 0; i < ds.size(); ++i) serial.push_back(values(ds.get(i).input));
  ASSERT_EQ(ds.get(0).input.shape(), (st::Shape{3, 8, 8}));
  // two threads, reversed order, same results
  std::vector<std::vector<double>> threaded(ds.size());
  auto work = [&](int parity) {
    for (int64_t i = ds.size() - 1; i >= 0; --i)
      if (i % 2 == parity) threaded[i] = values(ds.get(i).input);
  };
  std::thread t0(work, 0), t1(work, 1);
  t0.join(), t1.join();
  EXPECT_EQ(serial, threaded);
  EXPECT_NE(serial[0], serial[2]);  // different indices draw different crops
  ds.set_epoch(1);
  EXPECT_NE(values(ds.get(0).input), serial[0]);
  sd::ImageFolder other_seed(dir.str(), tf, 43);
  EXPECT_NE(values(other_seed.get(0).input), serial[0]);
}

// A DataLoader tells the dataset each pass's epoch, so augmentation changes from epoch to epoch
// without the training loop's help, and a run resumed mid-epoch from the loader's state, with
// a new dataset object, gets the crops the uninterrupted run got.
TEST(ImageFolder, LoaderSetsTheEpochSoResumedRunsAugmentAlike) {
  TempDir dir;
  for (int i = 0; i < 8; ++i) {
    const auto png = encode_png({.width = 20, .height = 16}, random_bytes(960, i));
    write_bytes(dir / fmt::format("c{}/{}.png", i % 2, i), png);
  }
  sd::Compose tf({sd::RandomResizedCrop(8), sd::RandomHorizontalFlip(), sd::ToTensor()});
  const sd::LoaderOptions options{.batch_size = 2, .num_workers = 2, .seed = 5};
  sd::DataLoader<sd::Example> loader(std::make_shared<sd::ImageFolder>(dir.str(), tf, 42), options);
  std::vector<std::vector<double>> epoch0, epoch1;
  for (auto& batch : loader) epoch0.push_back(values(batch.input));
  sd::LoaderState after_one;
  for (auto& batch : loader) {
    epoch1.push_back(values(batch.input));
    if (epoch1.size() == 1) after_one = loader.state();
  }
  ASSERT_EQ(epoch0.size(), 4u);
  ASSERT_EQ(epoch1.size(), 4u);
  for (size_t b = 0; b < epoch0.size(); ++b) EXPECT_NE(epoch0[b], epoch1[b]) << "batch " << b;  // same images
  sd::DataLoader<sd::Example> resumed(std::make_shared<sd::ImageFolder>(dir.str(), tf, 42), options);
  resumed.load_state(after_one);
  std::vector<std::vector<double>> rest;
  for (auto& batch : resumed) rest.push_back(values(batch.input));
  EXPECT_EQ(rest, std::vector<std::vector<double>>(epoch1.begin() + 1, epoch1.end()));
  // a const dataset is not told, and is still accepted
  std::shared_ptr<const sd::ImageFolder> const_folder = std::make_shared<sd::ImageFolder>(dir.str(), tf, 42);
  sd::DataLoader<sd::Example> fixed(const_folder, options);
  std::vector<std::vector<double>> first, second;
  for (auto& batch : fixed) first.push_back(values(batch.input));
  for (auto& batch : fixed) second.push_back(values(batch.input));
  EXPECT_EQ(first, epoch0);
  EXPECT_EQ(second, epoch0);
  sd::ImageFolder folder(dir.str(), tf, 42);
  expect_error([&] { folder.set_epoch(-1); }, {"negative epoch"});
}

TEST(ImageFolder, BadRootsRaise) {
  TempDir dir;
  expect_error([&] { sd::ImageFolder(dir / "nope"); }, {"not a directory"});
  expect_error([&] { sd::ImageFolder(dir.str()); }, {"no class subfolders"});
  write_bytes(dir / "a/1.png", encode_png({.width = 2, .height = 2}, random_bytes(12, 1)));
  write_bytes(dir / "b/readme.txt", {'x'});
  expect_error([&] { sd::ImageFolder(dir.str()); }, {"holds no", "b"});
}

TEST(ImageFolder, SymlinkedFoldersAreListedOnceAndLoopsEnd) {
  TempDir dir, outside;
  write_bytes(dir / "a/1.png", encode_png({.width = 2, .height = 2}, random_bytes(12, 1)));
  write_bytes(dir / "b/2.png", encode_png({.width = 2, .height = 2}, random_bytes(12, 2)));
  write_bytes(outside / "extra/3.png", encode_png({.width = 2, .height = 2}, random_bytes(12, 3)));
  namespace fs = std::filesystem;
  fs::create_directory_symlink("..", dir / "a/up");      // back to the root: b's files would join class a
  fs::create_directory_symlink(".", dir / "a/self1");    // two loops onto the class folder: 2^depth paths
  fs::create_directory_symlink(".", dir / "a/self2");
  fs::create_directory_symlink(outside / "extra", dir / "b/x1");  // a folder outside, linked twice
  fs::create_directory_symlink(outside / "extra", dir / "b/x2");
  sd::ImageFolder folder(dir.str());
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(folder.size(), 3);  // a/1.png, and b/2.png with the linked folder's file once
  EXPECT_EQ(folder.get(0).target.item<int64_t>(), 0);
  EXPECT_EQ(folder.get(1).target.item<int64_t>(), 1);
  EXPECT_EQ(folder.get(2).target.item<int64_t>(), 1);
}

// Dangling links are skipped wherever they are, whatever the listing order (PyTorch's
// ImageFolder skips them too): a missing target is the link's problem, not the folder's.
TEST(ImageFolder, DanglingLinksAreSkipped) {
  TempDir dir;
  write_bytes(dir / "a/1.png", encode_png({.width = 2, .height = 2}, random_bytes(12, 1)));
  write_bytes(dir / "b/2.png", encode_png({.width = 2, .height = 2}, random_bytes(12, 2)));
  namespace fs = std::filesystem;
  for (const char* name : {"a/0.png", "a/9.png", "b/old.jpg", "0class", "zclass"})
    fs::create_symlink(dir / "moved-away.png", dir / name);
  sd::ImageFolder folder(dir.str());
  EXPECT_EQ(folder.classes(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(folder.size(), 2);
}

// Samples come in torchvision's order (sorted(os.walk(...)), then sorted file names): a class
// folder's own files, then each folder's by the folder's path ("a/sub" < "a/sub-x" <
// "a/sub/sub2"), where sorting whole paths put "sub-x/c.png" before "sub/b.png".
TEST(ImageFolder, SamplesInTorchvisionsOrder) {
  TempDir dir;
  for (const char* name : {"a/z.png", "a/.x.png", "a/sub/b.png", "a/sub-x/c.png", "a/sub/sub2/d.png"})
    write_bytes(dir / name, encode_png({.width = 2, .height = 2}, random_bytes(12, 1)));
  sd::ImageFolder folder(dir.str());
  std::vector<std::string> names;
  for (const auto& [path, label] : folder.samples()) names.push_back(path.substr(dir.str().size() + 1));
  EXPECT_EQ(names,
            (std::vector<std::string>{"a/.x.png", "a/z.png", "a/sub/b.png", "a/sub-x/c.png", "a/sub/sub2/d.png"}));
}

TEST(ImageDecode, NonRegularFilesAreRefused) {
  TempDir dir;
  expect_error([&] { sd::read_image(dir.str()); }, {"not a regular file"});
  expect_error([&] { sd::read_file_bytes(dir.str()); }, {"not a regular file"});
  expect_error([&] { sd::read_image(dir / "missing.png"); }, {"missing.png"});
}

TEST(SyntheticImageDataset, DeterministicShapesAndLabels) {
  sd::SyntheticImageDataset ds(100, 3, 32, 24, 10, 7);
  EXPECT_EQ(ds.size(), 100);
  sd::Example a = ds.get(5), b = ds.get(5), c = ds.get(6);
  EXPECT_EQ(a.input.shape(), (st::Shape{3, 32, 24}));
  EXPECT_EQ(a.input.dtype(), st::kFloat32);
  EXPECT_EQ(values(a.input), values(b.input));
  EXPECT_EQ(a.target.item<int64_t>(), b.target.item<int64_t>());
  EXPECT_NE(values(a.input), values(c.input));
  std::vector<int> seen(10);
  for (int64_t i = 0; i < 100; ++i) {
    int64_t y = ds.get(i).target.item<int64_t>();
    ASSERT_TRUE(y >= 0 && y < 10);
    seen[y]++;
  }
  for (int k = 0; k < 10; ++k) EXPECT_GT(seen[k], 0) << k;
  auto v = values(a.input);
  double mean = 0, sq = 0;
  for (double x : v) mean += x, sq += x * x;
  mean /= v.size();
  EXPECT_NEAR(mean, 0, 0.1);
  EXPECT_NEAR(std::sqrt(sq / v.size() - mean * mean), 1, 0.1);
  EXPECT_THROW(ds.get(100), st::Error);
  EXPECT_THROW(sd::SyntheticImageDataset(10, 0, 4, 4, 10), st::Error);
}
