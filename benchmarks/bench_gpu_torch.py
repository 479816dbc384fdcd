#!/usr/bin/env python3
"""bench_gpu's rows through PyTorch eager, for the strata / PyTorch column of scripts/gpu-check.sh.

Same workloads, sizes, warm-up and median-of-repetitions as benchmarks/bench_gpu (CUDA events
on the current stream around each call), printed as "RESULT<TAB>key<TAB>value<TAB>unit<TAB>note"
lines with bench_gpu's keys:
  copy, add_f32, mul_f32, exp_f32, gelu_tanh_f32, add_bf16, sum_rows_f32, sum_cols_f32,
  sum_all_f32 (GB/s); gemm_{bf16,f16,tf32}_{4096,8192}, gemm_bf16_mlp_up, gemm_bf16_mlp_down
  (TFLOP/s, torch.matmul); adamw (GB/s at 28 bytes per parameter, torch.optim.AdamW with
  fused=True over 50 tensors); gpt_train (tokens/s, the Transformer example's GPT written in
  torch.nn: pre-LayerNorm blocks, causal scaled_dot_product_attention, tanh GELU, tied output);
  train_mlp, train_cnn, train_resnet50, train_gpt (bench_train's workloads: samples, images or
  tokens per second, torch.optim.AdamW / SGD with their default implementations).
float32 matmuls and convolutions run without TF32 except in the gemm_tf32 rows, as in strata.

  python3 bench_gpu_torch.py [--only copy,elementwise,reduce,gemm,adamw,gpt,gpt_fused,train]
                             [--workloads mlp,cnn,resnet50,gpt] [--reps N]
                             [--warmup N] [--scale F]
Without torch, or without a GPU that torch sees, it prints one "SKIP ..." line and exits 0.
"""
import argparse
import math
import statistics
import sys
import time

SECTIONS = ["copy", "elementwise", "reduce", "gemm", "adamw", "gpt", "gpt_fused", "train"]  # gpt_fused: as gpt


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    p.add_argument("--workloads", default="mlp,cnn,resnet50,gpt", help="the train section's workloads")
    p.add_argument("--reps", type=int, default=20, help="timed runs per row (median)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs before each row")
    p.add_argument("--scale", type=float, default=1.0, help="size factor of the memory-bound rows, (0, 4]")
    a = p.parse_args()
    a.only = [s for s in a.only.split(",") if s]
    a.workloads = [s for s in a.workloads.split(",") if s]
    if any(w not in ("mlp", "cnn", "resnet50", "gpt") for w in a.workloads):
        p.error("--workloads takes mlp, cnn, resnet50 and gpt")
    bad = [s for s in a.only if s not in SECTIONS]
    if bad:
        p.error(f"unknown section(s) {', '.join(bad)} ({', '.join(SECTIONS)})")
    if a.reps < 1 or a.warmup < 0 or not 0 < a.scale <= 4:
        p.error("--reps >= 1, --warmup >= 0 and --scale in (0, 4]")
    return a


def scaled(args, nominal):
    return max(1024, int(nominal * args.scale))


def median_ms(torch, args, fn):
    """Median of args.reps event-timed calls after args.warmup untimed ones."""
    for _ in range(args.warmup):
        fn()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(args.reps + 1)]
    events[0].record()
    for i in range(args.reps):
        fn()
        events[i + 1].record()
    events[-1].synchronize()
    return statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(args.reps))


def result(key, value, unit, note=""):
    print(f"RESULT\t{key}\t{value:.3f}\t{unit}\t{note}", flush=True)


def row(key, unit, measure):
    """Prints measure()'s value, or the row as unavailable with the exception's message."""
    try:
        result(key, measure(), unit)
    except Exception as e:  # a missing kernel or too little memory must not end the run
        print(f"RESULT\t{key}\tnan\t{unit}\tunavailable: {type(e).__name__}: {e}".replace("\n", " "), flush=True)


def memory_rows(torch, args):
    dev = "cuda"
    gbps = lambda nbytes, fn: nbytes / (median_ms(torch, args, fn) * 1e-3) / 1e9
    if "copy" in args.only:
        nbytes = scaled(args, 1 << 30)
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        row("copy", "GB/s", lambda: gbps(2 * nbytes, lambda: dst.copy_(src)))
        del src, dst
    if "elementwise" in args.only:
        n = scaled(args, 256 << 20)
        a = torch.randn(n, device=dev)
        b = torch.randn(n, device=dev)
        f = torch.nn.functional
        row("add_f32", "GB/s", lambda: gbps(12 * n, lambda: torch.add(a, b)))
        row("mul_f32", "GB/s", lambda: gbps(12 * n, lambda: torch.mul(a, b)))
        row("exp_f32", "GB/s", lambda: gbps(8 * n, lambda: torch.exp(a)))
        row("gelu_tanh_f32", "GB/s", lambda: gbps(8 * n, lambda: f.gelu(a, approximate="tanh")))
        a, b = a.bfloat16(), b.bfloat16()
        row("add_bf16", "GB/s", lambda: gbps(6 * n, lambda: torch.add(a, b)))
        del a, b
    if "reduce" in args.only:
        cols = 16384
        rows = max(1, scaled(args, cols * cols) // cols)
        x = torch.randn(rows, cols, device=dev)
        row("sum_rows_f32", "GB/s", lambda: gbps(4 * (rows * cols + rows), lambda: x.sum(1)))
        row("sum_cols_f32", "GB/s", lambda: gbps(4 * (rows * cols + cols), lambda: x.sum(0)))
        row("sum_all_f32", "GB/s", lambda: gbps(4 * (rows * cols + 1), lambda: x.sum()))
        del x
    torch.cuda.empty_cache()


def gemm_rows(torch, args):
    cases = []
    for name, dtype in (("bf16", torch.bfloat16), ("f16", torch.float16), ("tf32", torch.float32)):
        for s in (4096, 8192):
            cases.append((f"gemm_{name}_{s}", dtype, name == "tf32", s, s, s))
    cases.append(("gemm_bf16_mlp_up", torch.bfloat16, False, 8192, 3072, 768))
    cases.append(("gemm_bf16_mlp_down", torch.bfloat16, False, 8192, 768, 3072))
    for key, dtype, tf32, m, n, k in cases:
        def measure():
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            torch.backends.cuda.matmul.allow_tf32 = tf32
            try:
                return 2.0 * m * n * k / (median_ms(torch, args, lambda: torch.matmul(a, b)) * 1e-3) / 1e12
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
        row(key, "TFLOP/s", measure)
    torch.cuda.empty_cache()


def adamw_row(torch, args):
    total, tensors = scaled(args, 100_000_000), 50

    def measure():
        params = []
        for i in range(tensors):
            p = torch.randn(total // tensors + (1 if i < total % tensors else 0), device="cuda", requires_grad=True)
            p.grad = torch.randn_like(p)
            params.append(p)
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)
        return 28.0 * total / (median_ms(torch, args, opt.step) * 1e-3) / 1e9

    row("adamw", "GB/s", measure)
    torch.cuda.empty_cache()


def gpt_model(torch, vocab, context, layers, width, heads):
    """The Transformer example's GPT in torch.nn (examples/transformer/gpt.hpp)."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.c_attn, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp_fc, self.mlp_proj = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):  # (B, T, C)
            B, T, C = x.shape
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(C, 2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
            h = x + self.c_proj(y)
            return h + self.mlp_proj(F.gelu(self.mlp_fc(self.ln_2(h)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)

        def forward(self, tokens):
            x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
            for b in self.h:
                x = b(x)
            return self.ln_f(x) @ self.wte.weight.t()  # tied output embedding

    return GPT()


def train_rate(torch, args, model, opt, x, y, units_per_step):
    """Units per second from the median of whole steps (forward, cross-entropy, zero_grad,
    backward, optimizer step), each ending by reading the loss."""
    F = torch.nn.functional

    def step():
        out = model(x)
        loss = F.cross_entropy(out.flatten(0, 1) if out.dim() == 3 else out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(max(1, args.warmup)):
        step()
    seconds = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        loss = step()
        seconds.append(time.perf_counter() - t0)
    if not math.isfinite(loss):
        raise RuntimeError(f"the loss became {loss}")
    return units_per_step / statistics.median(seconds)


def gpt_row(torch, args):
    vocab, context, batch = 256, 256, 32

    def measure():
        torch.manual_seed(1)
        model = gpt_model(torch, vocab, context, layers=6, width=512, heads=8).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        x = torch.randint(0, vocab, (batch, context), device="cuda")
        y = torch.randint(0, vocab, (batch * context,), device="cuda")
        return train_rate(torch, args, model, opt, x, y, batch * context)

    row("gpt_train", "tokens/s", measure)
    torch.cuda.empty_cache()


def train_rows(torch, args):
    """bench_train's workloads (benchmarks/train_models.hpp, train_workload.h) on the GPU, with
    its optimizers and hyperparameters; torchvision's ResNet-50 is the same v1.5 model."""
    nn = torch.nn

    def conv(i, o, k, stride, pad):
        return nn.Conv2d(i, o, k, stride=stride, padding=pad, bias=False)

    class BasicBlock(nn.Module):
        def __init__(self, i, o, stride):
            super().__init__()
            self.conv1, self.bn1 = conv(i, o, 3, stride, 1), nn.BatchNorm2d(o)
            self.conv2, self.bn2 = conv(o, o, 3, 1, 1), nn.BatchNorm2d(o)
            self.downsample = (nn.Sequential(conv(i, o, 1, stride, 0), nn.BatchNorm2d(o))
                               if stride != 1 or i != o else None)

        def forward(self, x):
            h = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(h + (self.downsample(x) if self.downsample is not None else x))

    class Cnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.bn = conv(3, 64, 3, 1, 1), nn.BatchNorm2d(64)
            blocks, i = [], 64
            for width in (64, 128, 256):
                for b in range(2):
                    blocks.append(BasicBlock(i, width, 2 if b == 0 and width != 64 else 1))
                    i = width
            self.layers = nn.Sequential(*blocks)
            self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(256, 10)

        def forward(self, x):
            return self.fc(self.pool(self.layers(torch.relu(self.bn(self.stem(x))))).flatten(1))

    def mlp():
        return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))

    def resnet50():
        import torchvision
        return torchvision.models.resnet50(weights=None)

    def gpt():
        return gpt_model(torch, 256, 128, layers=6, width=256, heads=8)

    # key, model, batch, input shape after the batch (None: tokens), classes, units per sample, adamw
    workloads = [("train_mlp", mlp, 256, (784,), 10, 1, True), ("train_cnn", Cnn, 32, (3, 32, 32), 10, 1, False),
                 ("train_resnet50", resnet50, 64, (3, 224, 224), 1000, 1, False),
                 ("train_gpt", gpt, 16, None, 256, 128, True)]
    for key, make, batch, shape, classes, units, adamw in workloads:
        if key[len("train_"):] not in args.workloads:
            continue

        def measure():
            torch.manual_seed(1)
            model = make().cuda()
            if adamw:
                opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
            else:
                opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
            if shape is None:
                x = torch.randint(0, classes, (batch, 128), device="cuda")
                y = torch.randint(0, classes, (batch * 128,), device="cuda")
            else:
                x = torch.randn((batch,) + shape, device="cuda")
                y = torch.randint(0, classes, (batch,), device="cuda")
            return train_rate(torch, args, model, opt, x, y, batch * units)

        unit = "tokens/s" if key == "train_gpt" else "images/s" if key == "train_resnet50" else "samples/s"
        row(key, unit, measure)
        torch.cuda.empty_cache()


def main():
    args = parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"SKIP bench_gpu_torch: torch is not importable ({e})")
        return 0
    if not torch.cuda.is_available():
        print(f"SKIP bench_gpu_torch: torch {torch.__version__} sees no CUDA device")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False  # convolutions in float32 too, as strata's by default
    p = torch.cuda.get_device_properties(0)
    print(f"bench_gpu_torch: torch {torch.__version__} on {p.name} (compute capability {p.major}.{p.minor}); "
          f"{args.warmup} warm-up runs, median of {args.reps}, scale {args.scale:g}", flush=True)
    sections = [(memory_rows, True), (gemm_rows, "gemm" in args.only), (adamw_row, "adamw" in args.only),
                (gpt_row, "gpt" in args.only or "gpt_fused" in args.only), (train_rows, "train" in args.only)]
    for run, wanted in sections:
        try:  # rows catch their own errors; this catches failures while making a section's inputs
            if wanted:
                run(torch, args)
        except Exception as e:
            print(f"bench_gpu_torch: {run.__name__} failed: {type(e).__name__}: {e}", flush=True)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
