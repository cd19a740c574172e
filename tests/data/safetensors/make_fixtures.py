#!/usr/bin/env python3
"""Writes the safetensors fixtures read by tests/test_safetensors.c.

The files are made by the official `safetensors` library (with numpy, and ml_dtypes
for bfloat16), so the C reader is checked against an independent writer. CI does not
run this script: its outputs are committed. To regenerate:

    python3 -m venv /tmp/stvenv && /tmp/stvenv/bin/pip install safetensors numpy ml_dtypes
    /tmp/stvenv/bin/python tests/data/safetensors/make_fixtures.py

Values: element i of a formula tensor is formula(i + base) * scale, computed in float64
(exact in C too: integer arithmetic and one correctly rounded division), rounded to
float32, then cast by numpy / ml_dtypes to the tensor's dtype (round to nearest even).
test_safetensors.c recomputes the same values with its own rounding.
"""
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))


def formula(n, base=0, scale=1.0):
    """((i * 37) % 101 - 50) / 7 * scale for i in base..base+n-1, as float32."""
    i = np.arange(base, base + n, dtype=np.int64)
    return ((((i * 37) % 101) - 50).astype(np.float64) / 7.0 * scale).astype(np.float32)


def bf16(a):
    return np.asarray(a, dtype=np.float32).astype(ml_dtypes.bfloat16)


# Float32 inputs (all exactly representable) whose float16 casts hit the edge cases;
# the C test hard-codes the float16 bit patterns numpy produces (checked below).
F16_SPECIAL_IN = np.array([
    2.0**-24, -(2.0**-24), 3 * 2.0**-24, 1023 * 2.0**-24,   # subnormals
    2.0**-14, 65504.0, 65519.0, 65520.0,                     # min normal, max, rounds to max, to inf
    np.inf, -np.inf, np.nan, -0.0,
    2.0**-25, 0.75 * 2.0**-24, 1.5 * 2.0**-24, 2.5 * 2.0**-24,  # ties and near-ties below 2^-24
    1.0 / 3.0, 1e-7, -1e-5, 1 + 2.0**-10, 1 + 2.0**-11, 1 + 3 * 2.0**-11,
], dtype=np.float32)
F16_SPECIAL_BITS = [
    0x0001, 0x8001, 0x0003, 0x03FF,
    0x0400, 0x7BFF, 0x7BFF, 0x7C00,
    0x7C00, 0xFC00, None, 0x8000,
    0x0000, 0x0001, 0x0002, 0x0002,
    0x3555, 0x0002, 0x80A8, 0x3C01, 0x3C00, 0x3C02,
]

BF16_SPECIAL_IN = np.array([
    1.0, -2.5, 1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.4028234663852886e38, np.inf, -np.inf, np.nan,
    -0.0, 1e-40, 2.0**-126, 0.1,
], dtype=np.float32)
BF16_SPECIAL_BITS = [
    0x3F80, 0xC020, 0x3F80, 0x3F82, 0x7F80, 0x7F80, 0xFF80, None,
    0x8000, 0x0001, 0x0080, 0x3DCD,
]


def check_bits(arr, want, width):
    got = arr.view(np.uint16)
    for g, w, x in zip(got, want, arr.astype(np.float32)):
        if w is None:
            assert np.isnan(x), x
        else:
            assert int(g) == w, f"{x}: got {int(g):#06x}, want {w:#06x} ({width})"


def main():
    with np.errstate(over="ignore"):  # 65520 and inf overflow on purpose
        f16_special = F16_SPECIAL_IN.astype(np.float16)
    check_bits(f16_special, F16_SPECIAL_BITS, "f16")
    bf16_special = bf16(BF16_SPECIAL_IN)
    check_bits(bf16_special, BF16_SPECIAL_BITS, "bf16")

    tensors = {
        "x_bf16": bf16(formula(4 * 6, base=0)).reshape(4, 6),
        "x_f16": formula(4 * 6, base=100, scale=1000.0).astype(np.float16).reshape(4, 6),
        "x_f32": formula(2 * 6 * 3 * 4, base=200).reshape(2, 6, 3, 4),
        "x_f64": (formula(3 * 5, base=300).astype(np.float64) / 3.0).reshape(3, 5),
        "x_bf16_rows": bf16(formula(2 * 6 * 3, base=400)).reshape(2, 6, 3),
        "f16_special": f16_special,
        "bf16_special": bf16_special,
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((3, 0), dtype=np.float16),
        "layer.0/n\u00e4me": np.array([1.0, -1.0], dtype=np.float32),
    }
    save_file(tensors, os.path.join(HERE, "dtypes.safetensors"),
              metadata={"format": "np", "producer": "mlagen make_fixtures.py"})
    save_file({}, os.path.join(HERE, "no_tensors.safetensors"), metadata={"note": "empty"})


if __name__ == "__main__":
    main()
