"""TensorBoard's own reader against a Loom run: every scalar of metrics.jsonl, at every step,
once, in the run's event files.

usage: check_tensorboard.py RUN_DIR TB_DIR TRAIN_BATCH

Loads TB_DIR with tensorboard's EventAccumulator (the loader behind its scalar dashboard,
which also applies SessionLog START purges across the folder's files) and compares each tag's
(step, value) list with the rows of RUN_DIR/metrics.jsonl, the x axis being DeepSpeed's
(samples = step x TRAIN_BATCH). Prints "check_tensorboard: OK ..." and exits 0 when every
value is there exactly once and equal in float32.
"""
import json
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def f32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


def main():
    run_dir, tb_dir, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
    want = {}
    for line in open(f"{run_dir}/metrics.jsonl"):
        row = json.loads(line)
        if "step" not in row:
            continue
        x = row["step"] * batch
        if "loss" in row:
            want.setdefault("Train/Samples/train_loss", []).append((x, row["loss"]))
            want.setdefault("Train/Samples/lr", []).append((x, row["lr"]))
            want.setdefault("Train/Samples/grad_norm", []).append((x, row["grad_norm"]))
            want.setdefault("Train/Samples/tokens_per_s", []).append((x, row["tokens_per_s"]))
            for r, b in enumerate(row["rss_bytes"]):
                want.setdefault(f"Train/Samples/rss_mib_rank{r}", []).append((x, b / 1048576.0))
        if "eval_loss" in row:
            want.setdefault("Train/Samples/eval_loss", []).append((x, row["eval_loss"]))

    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    bad = []
    if tags != set(want):
        bad.append(f"tags {sorted(tags)} != metrics' {sorted(want)}")
    n = 0
    for tag, rows in want.items():
        if tag not in tags:
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        exp = sorted((x, f32(v)) for x, v in rows)
        if sorted(got) != exp:
            bad.append(f"{tag}: tensorboard has {sorted(got)[:8]}..., metrics.jsonl {exp[:8]}...")
        n += len(got)
    if bad:
        print("check_tensorboard: FAIL\n  " + "\n  ".join(bad))
        sys.exit(1)
    steps = len({x for rows in want.values() for x, _ in rows})
    print(f"check_tensorboard: OK {n} scalars of {len(want)} tags at {steps} steps")


if __name__ == "__main__":
    main()
