"""bench/bench_retriever.py runs end to end on a small index (in-process rows and a real server over
loopback) and writes its JSON: the benchmark had crashed unseen when ``RetrieverService.search_batch``'s
items gained the excluded dialogue."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_retriever_smoke_run_writes_every_row(tmp_path):
    out = tmp_path / "retriever.json"
    subprocess.run([sys.executable, "bench/bench_retriever.py", "--chunks", "200", "--queries", "32", "--batch", "8",
                    "--concurrency", "1,4", "--inprocess-single", "8", "--out", str(out)],
                   cwd=ROOT, check=True, timeout=600, capture_output=True, text=True)
    d = json.loads(out.read_text())
    assert set(d["rows"]) == {"in-process b8", "in-process b1", "server c1", "server c4"}
    assert d["index"]["count"] == 200 and all(r["qps"] > 0 for r in d["rows"].values())
