"""ESC-Preference against the project's own counselor API (a real ``escrag serve counselor`` process)
serving the embedded SmolLM2-135M in every role, with ``configs/prefs-smollm2.yaml`` on three states:
SmolLM2 cannot follow the JSON prompts (and the counselor API answers with its own counselor prompt),
so answers come back malformed; the build still finishes with exit 0, accounts for every state (kept +
dropped = selected, every drop with a reason, malformed answers counted per step), records exactly the
calls the server answered (its /metrics counter), and a rerun sends the server no request.
Run: .venv/bin/python -m pytest -q -m slow tests/test_preference_smollm2.py  (a few minutes on 2 cores)"""

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from escrag.web.procs import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def served(url: str) -> int:
    """Chat completions the counselor has answered, from its Prometheus counter."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = re.search(r'escrag_counselor_requests_total\{path="/v1/chat/completions",status="200"\} (\S+)', text)
    return int(float(found.group(1))) if found else 0


def test_smollm2_in_every_role_finishes_and_counts(tmp_path):
    server = ServerProcess("counselor", ["counselor", "--policy", "packaged:smollm2-135m-instruct", "--no-rag",
                                         "--config", "configs/cpu-demo.yaml"], tmp_path, timeout=600)
    try:
        base = f"{server.url}/v1"
        cmd = [sys.executable, "-m", "escrag", "prefs", "build", "--config", "configs/prefs-smollm2.yaml",
               "-o", f"run.output_dir={tmp_path / 'run'}", "-o", "prefs.states=3",
               *[x for n in ("smol-a", "smol-b", "smol-c", "smol") for x in ("-o", f"endpoints.{n}.base_url={base}")]]
        first = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=ROOT)
        assert first.returncode == 0, first.stderr[-3000:]
        answered = served(server.url)
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert again.returncode == 0 and served(server.url) == answered  # the rerun asked nothing
    finally:
        server.stop()
    out = tmp_path / "run" / "esc_preference"
    summary = json.loads((out / "summary.json").read_text())
    st = summary["states"]
    assert st["selected"] == 3 and st["kept"] + st["dropped"] == 3 and st["failed"] == st["pending"] == 0
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert len(rejects) == st["dropped"] and all(r["reason"] and r["detail"] for r in rejects)
    assert sum(summary["dropped"].values()) == st["dropped"]
    assert sum(summary["malformed_answers"].values()) >= st["dropped"]  # SmolLM2 cannot write the JSON
    assert sum(e["calls"] for e in summary["endpoints"].values()) == answered > 0
    assert summary["this_run"] == {**summary["this_run"], "calls_made": 0, "calls_reused": answered}  # the rerun's
    print("\n" + first.stdout)  # the kept/dropped table (pytest -s shows it)
