"""Summarise runs of several algorithms and seeds into one markdown table.

    for s in 1 2 3; do for k in decoupled-ppo ppo grpo dr-grpo dapo gspo rloo; do
      target/release/areal train -q --seed $s --set algorithm.kind=$k --out runs/algos/seed$s/$k
    done; done
    python3 tests/scripts/algorithm_table.py runs/algos

Reads `<root>/seed<N>/<kind>/summary.json`, and `metrics.jsonl` for the mean training reward
of the last 50 steps, the mean token lag (policy versions between sampling and training) and
the groups rejected (filtered by the algorithm, or failed).
"""
import json
import pathlib
import statistics
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "runs/algos")
seeds = sorted(root.glob("seed*"), key=lambda p: int(p.name[4:]))
kinds = []
for s in seeds:
    for d in sorted(s.iterdir()):
        if (d / "summary.json").exists() and d.name not in kinds:
            kinds.append(d.name)
order = ["decoupled-ppo", "ppo", "grpo", "dr-grpo", "dapo", "gspo", "rloo"]
kinds.sort(key=lambda k: order.index(k) if k in order else len(order))

names = [s.name[4:] for s in seeds]
print("| algorithm | " + " | ".join(f"seed {n}" for n in names)
      + " | mean final | mean gain | train reward, last 50 steps | token lag mean | groups rejected"
      + " | wall s (mean) |")
print("|---" * (len(names) + 7) + "|")
for k in kinds:
    finals, gains, rewards, rejected, walls, lags, cells = [], [], [], [], [], [], []
    for s in seeds:
        p = s / k / "summary.json"
        if not p.exists():
            cells.append("–")
            continue
        d = json.loads(p.read_text())
        finals.append(d["final_accuracy"])
        gains.append(d["final_accuracy"] - d["baseline_accuracy"])
        cells.append(f"{d['baseline_accuracy']:.3f} → {d['final_accuracy']:.3f}")
        steps = [json.loads(line) for line in (s / k / "metrics.jsonl").open()]
        steps = [m for m in steps if m.get("event") == "step"]
        rewards.append(statistics.mean(m["reward_mean"] for m in steps[-50:]))
        rejected.append(steps[-1]["rejected_total"])
        lags.append(statistics.mean(m["token_lag_mean"] for m in steps))
        walls.append(d["wall_seconds"])
    mean = lambda xs: statistics.mean(xs) if xs else float("nan")  # noqa: E731
    print(f"| `{k}` | " + " | ".join(cells)
          + f" | **{mean(finals):.3f}** | {mean(gains):+.3f} | {mean(rewards):.3f}"
          + f" | {mean(lags):.2f} | {mean(rejected):.0f} | {mean(walls):.0f} |")
