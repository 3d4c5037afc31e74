"""What the cost model predicts for issue 28's reference ops on each hardware profile.

An 8192^3 MatMul traced with tf.matmul in bfloat16, float16 and float32 (TF32 on, and off), and a
DeepCopy of an 8192x8192 float32 tensor (an HBM-bound copy: bytes read plus written), priced by
``tflms.sim.cost.op_time_s``. Compare with measured rates (issue 28: 798 TFLOP/s and 3.0 TB/s on an
H100 80GB HBM3). Run from the repository root:

    PYTHONPATH=$PWD python tools/price_ops.py [--profiles h100-80gb-sxm5,h200-141gb] [--json]
"""

from __future__ import annotations

import argparse
import json

N = 8192


def _op(graph, op_type):
    return next(op for op in graph if op.type == op_type)


def price(profile_names):
    import tensorflow as tf

    from tflms.ir.tf_io import load_graph
    from tflms.profiles import get_profile
    from tflms.sim.cost import op_math_mode, op_time_s

    spec = lambda dtype: tf.TensorSpec((N, N), dtype)  # noqa: E731
    matmuls = {d: load_graph(tf.function(tf.matmul).get_concrete_function(spec(d), spec(d)))
               for d in (tf.bfloat16, tf.float16, tf.float32)}
    copy = load_graph(tf.function(lambda x: tf.raw_ops.DeepCopy(x=x)).get_concrete_function(spec(tf.float32)))
    rows = []
    for name in profile_names:
        base = get_profile(name)
        row = {"profile": name}
        for label, dtype, profile in (("bf16", tf.bfloat16, base), ("fp16", tf.float16, base),
                                      ("fp32_tf32_on", tf.float32, base.with_tf32(True)),
                                      ("fp32_tf32_off", tf.float32, base.with_tf32(False))):
            graph = matmuls[dtype]
            op = _op(graph, "MatMul")
            row[f"matmul_{label}_tflops"] = round(2 * N**3 / op_time_s(graph, op, profile) / 1e12, 1)
            row[f"matmul_{label}_mode"] = op_math_mode(graph, op, profile)
        row["copy_tb_per_s"] = round(2 * N * N * 4 / op_time_s(copy, _op(copy, "DeepCopy"), base) / 1e12, 2)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    from tflms.profiles import profile_names
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profiles", default=",".join(profile_names()))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = price([p for p in args.profiles.split(",") if p])
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| profile | bf16 MatMul | fp16 MatMul | fp32 MatMul (TF32 on) | fp32 MatMul (TF32 off) | copy |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r[f'matmul_{k}_tflops']:g} TFLOP/s ({r[f'matmul_{k}_mode']})"
                 for k in ("bf16", "fp16", "fp32_tf32_on", "fp32_tf32_off")]
        print(f"| {r['profile']} | " + " | ".join(cells) + f" | {r['copy_tb_per_s']:g} TB/s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
