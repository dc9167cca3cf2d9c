#!/usr/bin/env python3
"""Idle time per pipeline stage from Loom schedule traces (dist/job_trace.h), against the
bubble fraction (p - 1) / (m + p - 1) of GPipe and 1F1B.

  python3 bench/pp_bubble.py TRACE.json [...]  (names like trace-<model>-<schedule>-m<M>.json)

For every rank (one track per rank; the first traced step is left out: it begins as
unevenly as the step before it ended, e.g. a warm-up with the optimizer's first touch):
  step idle   = 1 - (time inside forward, backward and optimizer spans) / the rank's step;
                what a step costs on top of the work, communication and waits included.
  window idle = 1 - (time inside this rank's forward and backward spans) / the pass window,
                the window being from the step's first forward to its last backward over
                all ranks. With equal stages and free communication the bubble theory
                predicts exactly this: each rank busy m (tf + tb) of (m + p - 1)(tf + tb).
  predicted   = the same schedule with stage r taking its measured t_r (F + B per micro-
                batch) and free communication: the passes end after
                W = sum_r t_r + (m - 1) max_r t_r, stage r idle 1 - m t_r / W; with equal
                stages this is (p - 1) / (m + p - 1), and the gap between the two is what
                unequal stages cost, not the schedule.
  slowest     = the window idle of the stage with the largest t_r: the pipeline runs at that
                stage's pace, so its idle is what the step loses to the schedule (the
                bubble); a faster stage idles that plus its lead over the slowest.
Prints one row per trace: model, schedule, m, the idle fractions per stage, their means,
the window mean's ratio to theory and to the prediction, the slowest stage's window idle
against theory, and each stage's t_r.
"""
import json
import re
import sys


def union_length(intervals):
    total, end = 0.0, None
    for b, e in sorted(intervals):
        if end is None or b > end:
            total += e - b
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def analyse(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    stage_of = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "thread_name":
            stage_of[e["tid"]] = int(re.search(r"pp (\d+)", e["args"]["name"]).group(1))
    p = len(set(stage_of.values()))
    spans = {tid: [] for tid in stage_of}
    for e in events:
        if e["ph"] == "X":
            spans[e["tid"]].append((e["ts"], e["ts"] + e["dur"], e["cat"]))
    steps = {tid: sorted((b, e) for b, e, c in s if c == "step") for tid, s in spans.items()}
    n_steps = min(len(v) for v in steps.values())
    if n_steps < 2:
        sys.exit(f"{path}: needs at least 2 steps (the first is warm-up)")
    ranks = sorted(stage_of, key=lambda t: (stage_of[t], t))
    step_idle = {t: [] for t in ranks}
    window_idle = {t: [] for t in ranks}
    pass_time = {t: [] for t in ranks}
    m = None
    for k in range(1, n_steps):
        inside = {}
        for t in ranks:
            b, e = steps[t][k]
            inside[t] = [(sb, se, c) for sb, se, c in spans[t] if sb >= b and se <= e]
        passes = {t: [(sb, se) for sb, se, c in inside[t] if c in ("forward", "backward")]
                  for t in ranks}
        w0 = min(sb for t in ranks for sb, _ in passes[t])
        w1 = max(se for t in ranks for _, se in passes[t])
        for t in ranks:
            b, e = steps[t][k]
            busy = union_length([(sb, se) for sb, se, c in inside[t]
                                 if c in ("forward", "backward", "optimizer")])
            step_idle[t].append(1 - busy / (e - b))
            fb = union_length(passes[t])
            window_idle[t].append(1 - fb / (w1 - w0))
            m = len(passes[t]) // 2
            pass_time[t].append(fb / m)

    def mean(v):
        return sum(v) / len(v)

    return {
        "p": p,
        "m": m,
        "steps": n_steps - 1,
        "step_idle": [mean(step_idle[t]) for t in ranks],
        "window_idle": [mean(window_idle[t]) for t in ranks],
        "ms_per_micro": [mean(pass_time[t]) / 1e3 for t in ranks],
    }


def main(paths):
    rows = []
    for path in paths:
        r = analyse(path)
        name = re.search(r"trace-(?:([a-z0-9]+)-)?([a-z0-9]+)-m(\d+)", path)
        r["model"] = (name.group(1) or "") if name else ""
        r["schedule"] = name.group(2) if name else path
        rows.append(r)
    print("| model | schedule | m | step idle per stage (mean) | pass-window idle per stage"
          " (mean) | theory (p-1)/(m+p-1) | window / theory | predicted from t_r (mean) |"
          " window / predicted | slowest stage's window idle / theory |"
          " t_r = F+B ms per micro-batch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        p, m = r["p"], r["m"]
        theory = (p - 1) / (m + p - 1)
        t = r["ms_per_micro"]
        window = sum(t) + (m - 1) * max(t)
        predicted = [1 - m * x / window for x in t]
        slowest = t.index(max(t))
        s, w = r["step_idle"], r["window_idle"]

        def mean(v):
            return sum(v) / len(v)

        def fmt(v):
            return " / ".join(f"{x:.3f}" for x in v) + f" ({mean(v):.3f})"

        print(f"| {r['model']} | {r['schedule']} | {m} | {fmt(s)} | {fmt(w)} | {theory:.3f} | "
              f"{mean(w) / theory:.2f} | {fmt(predicted)} | {mean(w) / mean(predicted):.2f} | "
              f"{w[slowest]:.3f} / {theory:.3f} = {w[slowest] / theory:.2f} | "
              f"{' / '.join(f'{x:.0f}' for x in t)} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
