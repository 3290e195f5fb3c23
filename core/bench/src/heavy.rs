//! The CPU-heavy set of `areal bench sandbox --set heavy`: programs at the sizes of
//! LiveCodeBench's private tests (tight loops of 10⁶–10⁷ steps, sorting and hashing 3·10⁵
//! numbers, deep recursion, big integers, string building; numpy's vectorised arithmetic,
//! sorting, prefix sums and parsing on 10⁶ elements, and a matrix product), each with one
//! generated input.
//! The expected output is what native CPython prints, so the set needs no answers written
//! down, and a wasm run that prints anything else fails the bench.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// One program and its input.
pub(super) struct Heavy {
    pub(super) id: &'static str,
    pub(super) code: &'static str,
    pub(super) input: String,
}

fn numbers(rng: &mut StdRng, n: usize, max: u64) -> String {
    let values: Vec<String> = (0..n)
        .map(|_| rng.random_range(1..=max).to_string())
        .collect();
    format!("{n}\n{}\n", values.join(" "))
}

/// The set, the same every time.
pub(super) fn set() -> Vec<Heavy> {
    let mut rng = StdRng::seed_from_u64(19);
    let mut lines = |n: usize| -> String {
        let mut s = format!("{n}\n");
        for _ in 0..n {
            let (a, b): (u32, u32) = (
                rng.random_range(0..1_000_000),
                rng.random_range(0..1_000_000),
            );
            s.push_str(&format!("{a} {b}\n"));
        }
        s
    };
    let pairs = lines(300_000);
    let mut rng = StdRng::seed_from_u64(20);
    let big = numbers(&mut rng, 300_000, 1_000_000_000);
    let small = numbers(&mut rng, 300_000, 1000);
    let mut edges = String::from("100000 300000\n");
    for _ in 0..300_000 {
        let (a, b, w): (u32, u32, u32) = (
            rng.random_range(1..=100_000),
            rng.random_range(1..=100_000),
            rng.random_range(1..=1000),
        );
        edges.push_str(&format!("{a} {b} {w}\n"));
    }
    let million = numbers(&mut rng, 1_000_000, 1_000_000_000);
    vec![
        Heavy {
            id: "loop-1e7",
            code: "n = int(input())\ns = 0\nfor i in range(n):\n    s += i * i % 7\nprint(s)\n",
            input: "10000000\n".into(),
        },
        Heavy {
            id: "while-3e6",
            code: "n = int(input())\ni = 0\nx = 1\nwhile i < n:\n    x = (x * 31 + i) % 1000000007\n    i += 1\nprint(x)\n",
            input: "3000000\n".into(),
        },
        Heavy {
            id: "sort-3e5",
            code: "import sys\ndata = sys.stdin.buffer.read().split()\nn = int(data[0])\na = sorted(map(int, data[1:n + 1]))\nprint(sum(i * v for i, v in enumerate(a)) % 998244353)\n",
            input: big.clone(),
        },
        Heavy {
            id: "hash-3e5",
            code: "import sys\nfrom collections import Counter\ndata = sys.stdin.read().split()\nc = Counter(data[1:])\nseen = set()\nfor k in c:\n    seen.add(hash(k) % 1000)\nprint(len(c), max(c.values()), len(seen) > 0)\n",
            input: small,
        },
        Heavy {
            id: "dict-3e5",
            code: "import sys\ninput = sys.stdin.readline\nn = int(input())\nd = {}\nfor _ in range(n):\n    a, b = map(int, input().split())\n    d[a % 100003] = d.get(a % 100003, 0) + b\nprint(len(d), sum(d.values()))\n",
            input: pairs,
        },
        Heavy {
            id: "recursion-3e4",
            code: "import sys\nsys.setrecursionlimit(100000)\ndef depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\nn = int(input())\nprint(sum(depth(n) for _ in range(30)))\n",
            input: "30000\n".into(),
        },
        Heavy {
            id: "memo-dp",
            code: "from functools import lru_cache\nimport sys\nsys.setrecursionlimit(100000)\n@lru_cache(maxsize=None)\ndef f(i, j):\n    if i == 0 or j == 0:\n        return 1\n    return (f(i - 1, j) + f(i, j - 1)) % 1000000007\nn = int(input())\nprint(f(n, n))\n",
            input: "600\n".into(),
        },
        Heavy {
            id: "grid-dp-1e6",
            code: "n = int(input())\ndp = [[0] * (n + 1) for _ in range(n + 1)]\nfor i in range(1, n + 1):\n    row, prev = dp[i], dp[i - 1]\n    for j in range(1, n + 1):\n        row[j] = max(prev[j], row[j - 1]) + (i * j) % 10\nprint(dp[n][n])\n",
            input: "1000\n".into(),
        },
        Heavy {
            id: "bigint",
            code: "import math\nn = int(input())\nx = math.factorial(n)\nprint(x.bit_length(), x % 1000000007, pow(3, n * 50, 10**9 + 9))\n",
            input: "30000\n".into(),
        },
        Heavy {
            id: "strings-1e6",
            code: "n = int(input())\nparts = []\nfor i in range(n):\n    parts.append(str(i % 97))\ns = ''.join(parts)\nt = s.replace('1', 'ab')\nprint(len(s), len(t), t.count('ab9'))\n",
            input: "1000000\n".into(),
        },
        Heavy {
            id: "sieve-5e6",
            code: "n = int(input())\nsieve = bytearray([1]) * (n + 1)\nsieve[0] = sieve[1] = 0\nfor i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n        sieve[i * i::i] = bytes(len(range(i * i, n + 1, i)))\nprint(sum(sieve))\n",
            input: "5000000\n".into(),
        },
        Heavy {
            id: "dijkstra-1e5",
            code: "import sys, heapq\ndata = sys.stdin.buffer.read().split()\nn, m = int(data[0]), int(data[1])\nadj = [[] for _ in range(n + 1)]\nfor k in range(m):\n    a, b, w = int(data[2 + 3 * k]), int(data[3 + 3 * k]), int(data[4 + 3 * k])\n    adj[a].append((b, w))\n    adj[b].append((a, w))\ndist = [1 << 60] * (n + 1)\ndist[1] = 0\nh = [(0, 1)]\nwhile h:\n    d, u = heapq.heappop(h)\n    if d > dist[u]:\n        continue\n    for v, w in adj[u]:\n        if d + w < dist[v]:\n            dist[v] = d + w\n            heapq.heappush(h, (d + w, v))\nprint(sum(x for x in dist[1:] if x < 1 << 60) % 1000000007)\n",
            input: edges,
        },
        Heavy {
            id: "numpy-vector-1e6",
            code: "import numpy as np\nn = int(input())\na = np.arange(n, dtype=np.int64)\nt = 0\nfor k in range(10):\n    b = (a * (2654435761 + k)) % 1000003\n    t += int((b * b % 998244353).max()) + int(b.sum())\nprint(t, round(float(np.sqrt(b).mean()), 6))\n",
            input: "1000000\n".into(),
        },
        Heavy {
            id: "numpy-sort-1e6",
            code: "import numpy as np\nn = int(input())\nb = (np.arange(n, dtype=np.int64) * 2654435761) % 1000003\ns = np.sort(b)\nidx = np.argsort(b, kind='stable')\nprint(int(s[::1000].sum()), int(idx[:1000].sum()), len(np.unique(b)))\n",
            input: "1000000\n".into(),
        },
        Heavy {
            id: "numpy-prefix-1e6",
            code: "import numpy as np\nn = int(input())\nb = (np.arange(n, dtype=np.int64) * 2654435761) % 1000003\nc = np.cumsum(b)\nw = c[n // 2:] - c[:n - n // 2]\nprint(int(w.max()), int(np.searchsorted(c, c[-1] // 3)), int(np.diff(c).min()))\n",
            input: "1000000\n".into(),
        },
        Heavy {
            id: "numpy-read-1e6",
            code: "import numpy as np\nn = int(input())\na = np.array(input().split(), dtype=np.int64)\nprint(int(a.sum()), int(np.bincount(a % 1000).argmax()))\n",
            input: million,
        },
        Heavy {
            id: "numpy-matmul-200",
            code: "import numpy as np\nn = int(input())\nm = np.arange(n * n, dtype=np.float64).reshape(n, n) % 17\nr = m @ m @ m\nprint(int(r.sum()), int(np.trace(r)), round(float(np.linalg.det(m[:8, :8] + np.eye(8))), 3))\n",
            input: "200\n".into(),
        },
    ]
}
