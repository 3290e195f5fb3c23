"""The staleness ablation as one table from one or more `areal bench async-vs-sync` results.json
files: per (mini-batches, η, algorithm) mean ± sd over seeds of the final accuracy and of the
mean of the last 50 steps' evaluations, with differences paired by seed against synchronous
decoupled PPO and against ppo at the same η. `LABEL=path` renames the algorithm of that
file's runs (a variant run with --set).

    python3 core/bench/scripts/staleness_table.py runs/bench/ahead/results.json \
        "masked=runs/bench/ahead-mask/results.json"

`--merge OUT FILE...` writes instead one results.json of the files' runs (the first file's
header; a run already there is not added again), for the bench to redraw its plots from:
given a folder whose results.json holds every run it asks for, the bench runs nothing.
"""
import json, sys, statistics as st
def key(r): return (r['algorithm'], r['minibatches'], r['max_staleness'], r['seed'])
if sys.argv[1:2] == ['--merge']:
    out, paths = sys.argv[2], sys.argv[3:]
    merged = json.load(open(paths[0]))
    seen = {key(r) for r in merged['runs']}
    for path in paths[1:]:
        for r in json.load(open(path))['runs']:
            if key(r) not in seen: merged['runs'].append(r); seen.add(key(r))
    json.dump(merged, open(out, 'w'), indent=1)
    sys.exit(0)
runs = {}
for arg in sys.argv[1:]:
    label, _, path = arg.rpartition('=')
    for r in json.load(open(path))['runs']:
        if label: r['algorithm'] = label
        runs[key(r)] = r
def last50(r):
    # as the bench's own tables and plot count it: the evaluations within 50 steps of the last
    last = r['curve'][-1]['step'] if r['curve'] else 0
    c = [p for p in r['curve'] if p['step'] + 50 >= last]
    return sum(p['accuracy'] for p in c) / len(c)
def ms(xs):
    if not xs: return '-'
    sd = st.stdev(xs) if len(xs) > 1 else 0.0
    return f"{st.mean(xs):.3f} ± {sd:.3f}"
def sms(xs):
    if not xs: return '-'
    sd = st.stdev(xs) if len(xs) > 1 else 0.0
    return f"{st.mean(xs):+.3f} ± {sd:.3f}"
known = ['decoupled-ppo', 'ppo', 'decoupled-ppo-log-linear']
algos = sorted({k[0] for k in runs}, key=lambda a: (known.index(a) if a in known else len(known), a))
mbs = sorted({k[1] for k in runs}); etas = sorted({k[2] for k in runs})
seeds = sorted({k[3] for k in runs})
print('| mini-batches | η | algorithm | seeds | final | last 50 steps | − sync (last 50, paired) | − ppo (last 50, paired) | staleness \\|Δ log π\\| | token lag |')
print('|---|---|---|---|---|---|---|---|---|---|')
for mb in mbs:
    for eta in etas:
        for a in algos:
            rs = [runs[(a, mb, eta, s)] for s in seeds if (a, mb, eta, s) in runs]
            if not rs: continue
            sync = {s: last50(runs[('decoupled-ppo', mb, 0, s)]) for s in seeds if ('decoupled-ppo', mb, 0, s) in runs}
            ppo = {s: last50(runs[('ppo', mb, eta, s)]) for s in seeds if ('ppo', mb, eta, s) in runs}
            dsync = [last50(r) - sync[r['seed']] for r in rs if r['seed'] in sync] if eta > 0 else []
            dppo = [last50(r) - ppo[r['seed']] for r in rs if r['seed'] in ppo] if a != 'ppo' else []
            stale = [r['staleness_abs_mean'] for r in rs if r.get('staleness_abs_mean') is not None]
            print(f"| {mb} | {eta} | {a} | {len(rs)} | {ms([r['final_accuracy'] for r in rs])} | {ms([last50(r) for r in rs])} | {sms(dsync)} | {sms(dppo)} | {ms(stale) if stale else '-'} | {st.mean(r['token_lag_mean'] for r in rs):.2f} |")
