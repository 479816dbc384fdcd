#!/usr/bin/env python3
"""safetensors interop between strata and PyPI's reference implementation.

  interop_safetensors.py HELPER INSPECT WORKDIR

Files written by `safetensors.numpy` (every numpy-representable dtype) are loaded by
strata and checked value by value; files written by strata are read back by
`safetensors.numpy.load_file` (bf16 as raw bytes) and compared byte for byte with what the
reference writes for the same arrays; strata-inspect lists them with xxHash64 checksums
checked against the small reference implementation below.
"""
import json
import os
import struct
import subprocess
import sys

try:
    import numpy as np
    import safetensors
    import safetensors.numpy as stn
except ImportError as e:
    sys.exit(f"FAIL: {e}: the Python test peers are missing; run scripts/setup.sh")

HELPER, INSPECT, WORK = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(WORK, exist_ok=True)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args):
    return subprocess.run(list(args), capture_output=True, text=True)


# ---- xxHash64 from its specification ------------------------------------------------------
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)
M = (1 << 64) - 1


def _rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def _round(acc, lane):
    return (_rotl((acc + lane * P2) & M, 31) * P1) & M


def xxh64(data, seed=0):
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & M, (seed + P2) & M, seed, (seed - P1) & M]
        while i + 32 <= n:
            for k in range(4):
                v[k] = _round(v[k], struct.unpack_from("<Q", data, i + 8 * k)[0])
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & M
        for k in range(4):
            h = ((h ^ _round(0, v[k])) * P1 + P4) & M
    else:
        h = (seed + P5) & M
    h = (h + n) & M
    while i + 8 <= n:
        h = (_rotl(h ^ _round(0, struct.unpack_from("<Q", data, i)[0]), 27) * P1 + P4) & M
        i += 8
    if i + 4 <= n:
        h = (_rotl(h ^ (struct.unpack_from("<I", data, i)[0] * P1) & M, 23) * P2 + P3) & M
        i += 4
    while i < n:
        h = (_rotl(h ^ (data[i] * P5) & M, 11) * P1) & M
        i += 1
    h = ((h ^ (h >> 33)) * P2) & M
    h = ((h ^ (h >> 29)) * P3) & M
    return h ^ (h >> 32)


assert xxh64(b"") == 0xEF46DB3751D8E999, "the reference xxh64 is wrong"


def dump(path):
    r = run(HELPER, "dump", path)
    check(r.returncode == 0, f"helper dump {path}: {r.stderr}")
    return json.loads(r.stdout) if r.returncode == 0 else {}


def check_inspect(path, arrays):
    r = run(INSPECT, path)
    check(r.returncode == 0, f"strata-inspect {path} exited {r.returncode}: {r.stderr}")
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[1:] if line and not line.startswith(" ")}
    for name, raw in arrays.items():
        row = rows.get(name)
        check(row is not None, f"strata-inspect {path} does not list {name}")
        if row:
            check(row[-2] == str(len(raw)), f"strata-inspect {name}: bytes {row[-2]} != {len(raw)}")
            check(row[-1] == f"{xxh64(raw):016x}", f"strata-inspect {name}: checksum {row[-1]} != {xxh64(raw):016x}")


# ---- reference -> strata ------------------------------------------------------------------
rng = np.random.default_rng(5)
strata_kinds = {"bool": "bool", "uint8": "uint8", "int8": "int8", "int32": "int32", "int64": "int64",
                "float16": "float16", "float32": "float32", "float64": "float64"}
other_kinds = {"int16": "I16", "uint16": "U16", "uint32": "U32", "uint64": "U64"}


def random_array(dtype, shape):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
    return rng.standard_normal(shape).astype(dt)


ours = {}
for k in strata_kinds:
    ours[f"{k}/matrix"] = random_array(k, (5, 7))
    ours[f"{k}/scalar"] = random_array(k, ())
    ours[f"{k}/empty"] = random_array(k, (0, 3))
ours["float32/transposed"] = np.ascontiguousarray(random_array("float32", (4, 6)).T)
ours["ünï"] = random_array("float32", (3,))
meta = {"format": "np", "note": "quote \" and ☃"}
path_a = os.path.join(WORK, "py_strata_dtypes.safetensors")
stn.save_file(ours, path_a, metadata=meta)
d = dump(path_a)
check(d.get("metadata") == meta, f"metadata {d.get('metadata')} != {meta}")
check("tensors" in d, f"strata failed to load {path_a}: {d.get('load_error')}")
for name, arr in ours.items():
    got = d.get("tensors", {}).get(name)
    check(got is not None, f"{name} missing")
    if got is None:
        continue
    check(got["dtype"] == strata_kinds[arr.dtype.name], f"{name}: dtype {got['dtype']} != {arr.dtype.name}")
    check(got["shape"] == list(arr.shape), f"{name}: shape {got['shape']} != {list(arr.shape)}")
    want = arr.astype(np.float64 if arr.dtype.kind == "f" else np.int64).ravel().tolist()
    check(got["values"] == want, f"{name}: values differ")
    check(d["entries"][name]["hex"] == arr.tobytes().hex(), f"{name}: bytes differ")
check_inspect(path_a, {n: a.tobytes() for n, a in ours.items()})

others = {k: random_array(k, (2, 3)) for k in other_kinds}
path_b = os.path.join(WORK, "py_other_dtypes.safetensors")
stn.save_file(others, path_b)
d = dump(path_b)
check("load_error" in d, "strata loaded U16/U32/U64/I16 tensors into Tensors")
check("has dtype" in d.get("load_error", ""), f"unclear error: {d.get('load_error')}")
for name, arr in others.items():
    e = d.get("entries", {}).get(name, {})
    check(e.get("dtype") == other_kinds[name], f"{name}: dtype {e.get('dtype')}")
    check(e.get("shape") == [2, 3], f"{name}: shape {e.get('shape')}")
    check(e.get("hex") == arr.tobytes().hex(), f"{name}: bytes differ")
check_inspect(path_b, {n: a.tobytes() for n, a in others.items()})

# ---- strata -> reference -----------------------------------------------------------------
r = run(HELPER, "write", WORK)
check(r.returncode == 0, f"helper write: {r.stderr}")
i = np.arange(12)
formula = {
    "bool": (i % 3 == 0), "uint8": ((i * 21) % 256).astype(np.uint8),
    "int8": ((i * 37) % 23 - 11).astype(np.int8), "int32": ((i * 37) % 23 - 11).astype(np.int32),
    "int64": ((i * 37) % 23 - 11).astype(np.int64) * 10**12,
    "float16": ((i - 5.5) * 0.25).astype(np.float16), "float32": ((i - 5.5) * 0.25).astype(np.float32),
    "float64": (i - 5.5) * 0.25,
}
want = {}
for k, v in formula.items():
    want[k] = v.reshape(3, 4)
    want[k + ".T"] = np.ascontiguousarray(v.reshape(3, 4).T)
want["scalar"] = np.array(2.5)
want["empty"] = np.zeros((0, 3), np.int32)
path_s = os.path.join(WORK, "strata_all.safetensors")
got = stn.load_file(path_s)
check(sorted(got) == sorted(want), f"names {sorted(got)} != {sorted(want)}")
for name, arr in want.items():
    g = got.get(name)
    check(g is not None and g.dtype == arr.dtype and g.shape == arr.shape and np.array_equal(g, arr),
          f"{name}: reference read {None if g is None else (g.dtype, g.shape, g.ravel()[:4])}")
with safetensors.safe_open(path_s, "np") as f:
    check(f.metadata() == {"written_by": "strata"}, f"metadata {f.metadata()}")
with open(path_s, "rb") as f:
    check(f.read() == stn.save(want, metadata={"written_by": "strata"}), "strata's bytes differ from the reference's")

with open(os.path.join(WORK, "strata_bf16.safetensors"), "rb") as f:
    raw = f.read()
entries = dict(safetensors.deserialize(raw))
bf = entries.get("bf16", {})
f32_bits = ((i - 5.5) * 0.25).astype(np.float32).view(np.uint32)
check(bf.get("dtype") == "BF16" and list(bf.get("shape", [])) == [3, 4], f"bf16 entry {bf}")
check(bytes(bf.get("data", b"")) == (f32_bits >> 16).astype("<u2").tobytes(), "bf16 bytes differ")

# ---- strata-inspect on a bad file ---------------------------------------------------------
bad = os.path.join(WORK, "bad.safetensors")
with open(bad, "wb") as f:
    f.write(raw[:-1])
r = run(INSPECT, bad)
check(r.returncode == 1, f"strata-inspect on a truncated file exited {r.returncode}")
check(r.stderr.startswith(f"strata-inspect: {bad}: "), f"strata-inspect stderr: {r.stderr!r}")

if failures:
    sys.exit(f"{len(failures)} interop checks failed")
print(f"interop ok: safetensors {safetensors.__version__}, numpy {np.__version__}")
