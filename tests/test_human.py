"""The blind pairwise human study end to end: ``escrag eval export-human`` writes pairs.csv and form.html
without system names (both A/B orders occur, the key lies apart in the run folder); the form is opened
in headless Chromium (Debian's ``chromium``, installed by ``make test`` through ``make browser``) driven over
the DevTools protocol on a pipe, filled by two annotators and saved (a Blob download); a third
annotator fills pairs.csv; ``escrag eval import-human`` reads the three files back through the key and
its win/tie/loss counts and Fleiss' kappa equal the ones computed from the planned choices; bad files
(another form, an unknown pair, a bad choice, a repeated annotator) are one-line errors.
Run: .venv/bin/python -m pytest -q tests/test_human.py"""

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from escrag.config import load_config
from evaluation.human import OUTCOMES, fleiss_kappa, majority
from evaluation.run import prepare

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--remote-debugging-pipe"]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, which ``make test`` installs (``make browser``); without it the test skips."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} missing: `make browser` installs Debian's chromium (as root)")
    return CHROMIUM


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (fds 3 and 4 of the child:
    NUL-terminated JSON messages), so no websocket library is needed."""

    def __init__(self, binary: str, profile: Path):
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()

        def wire():
            os.dup2(cmd_r, 3)
            os.dup2(res_w, 4)
        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     preexec_fn=wire, pass_fds=(3, 4), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(res_w)
        self._buf, self._id, self.events = b"", 0, []

    def _read(self, timeout: float = 30) -> dict:
        deadline = time.time() + timeout
        while b"\0" not in self._buf:
            if time.time() > deadline:
                raise TimeoutError("no DevTools message from chromium")
            chunk = os.read(self._res_r, 65536)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, session: str | None = None, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, url: str) -> str:
        target = self.send("Target.createTarget", url=url)["targetId"]
        return self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def js(self, session: str, expression: str):
        out = self.send("Runtime.evaluate", session, expression=expression, returnByValue=True,
                        awaitPromise=True)
        if "exceptionDetails" in out:
            raise RuntimeError(f"page error: {out['exceptionDetails']}")
        return out["result"].get("value")

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, OSError, TimeoutError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._res_r)


def fill_form(binary: str, form: Path, name: str, letters: dict, downloads: Path, profile: Path) -> Path:
    """Open the form, type the name, click one radio per pair, press Save; return the saved file."""
    downloads.mkdir(parents=True, exist_ok=True)
    browser = Browser(binary, profile)
    try:
        browser.send("Browser.setDownloadBehavior", behavior="allow", downloadPath=str(downloads))
        page = browser.open(form.resolve().as_uri())
        deadline = time.time() + 30
        loaded = "document.URL.startsWith('file:') && document.readyState === 'complete'"
        while not browser.js(page, loaded):  # the new tab shows about:blank first
            assert time.time() < deadline, "form did not load"
            time.sleep(0.1)
        assert browser.js(page, "document.querySelectorAll('.pair').length") == len(letters)
        browser.js(page, f"""(() => {{ const n = document.getElementById('annotator');
            n.value = {json.dumps(name)}; n.dispatchEvent(new Event('input')); }})()""")
        for pid, letter in letters.items():
            browser.js(page, f"document.querySelector('input[name={pid}][value={letter}]').click()")
        assert browser.js(page, "document.getElementById('status').textContent") == \
            f"{len(letters)} / {len(letters)} answered"
        browser.js(page, "document.getElementById('save').click()")
        target = downloads / f"annotations-{name}.json"
        deadline = time.time() + 30
        while not target.is_file():
            assert time.time() < deadline, f"no download in {downloads}: {list(downloads.iterdir())}"
            time.sleep(0.1)
        time.sleep(0.2)  # the file is renamed into place when complete
        return target
    finally:
        browser.close()


def make_run(tmp_path: Path) -> Path:
    """A run folder as `escrag eval` leaves it: config, states and per-state answers of three systems."""
    over = [f"run.output_dir={tmp_path / 'run'}", "eval.states=6", "eval.human.contexts=4",
            "eval.systems=[{name: ours, endpoint: e}, {name: gpt, endpoint: e}, {name: llama, endpoint: e}]",
            "endpoints.e.base_url=http://127.0.0.1:9/v1", "endpoints.e.model=m", "eval.human.system=ours"]
    cfg = load_config(None, over)
    run_dir, _, states, _ = prepare(cfg)
    with (run_dir / "per_state.jsonl").open("w") as fh:
        for s in states:
            sid = f"{s.dialogue_id}/{s.turn_index}"
            for name in ("ours", "gpt", "llama"):
                fh.write(json.dumps({"state_id": sid, "system": name,
                                     "response": f"Reply by {name} to {sid}: that sounds hard </script>."}) + "\n")
    return run_dir


def escrag(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "escrag", "eval", *args], capture_output=True, text=True)


def test_export_fill_in_chromium_and_import(tmp_path, chromium):
    run_dir, out = make_run(tmp_path), tmp_path / "annotators"
    res = escrag("export-human", "--run", str(run_dir), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["form.html", "pairs.csv"]  # the key is not there
    key = {r["pair_id"]: r for r in csv.DictReader((run_dir / "human" / "key.csv").open())}
    pairs = list(csv.DictReader((out / "pairs.csv").open()))
    assert len(pairs) == len(key) == 8 and list(pairs[0]) == ["pair_id", "context", "response_a", "response_b"]
    text = (out / "pairs.csv").read_text() + (out / "form.html").read_text()
    for name in ("ours", "gpt", "llama"):
        assert f"by {name} to" in text  # the responses are there, ...
        assert not any(name in v for p in pairs for k, v in p.items() if k in ("pair_id", "context"))
    assert {r["study"] for r in key.values()} == {"ours"}
    assert {r["system_a"] == "ours" for r in key.values()} == {True, False}  # both orders occur
    html = (out / "form.html").read_text()
    assert "http://" not in html and "https://" not in html and "<\\/script>" in html

    # planned outcomes for "ours" per annotator, turned into A/B letters through the key
    ids = sorted(key)
    plan = {"ann1": ["win", "win", "tie", "loss", "win", "win", "tie", "win"],
            "ann2": ["win", "tie", "tie", "loss", "loss", "win", "win", "win"],
            "ann3": ["loss", "win", "tie", "loss", "win", "tie", "win", "win"]}

    def letter(pid, o):
        if o == "tie":
            return "tie"
        ours_is_a = key[pid]["system_a"] == "ours"
        return "A" if (o == "win") == ours_is_a else "B"
    files = []
    for i, who in enumerate(("ann1", "ann2")):
        letters = {pid: letter(pid, o) for pid, o in zip(ids, plan[who])}
        files.append(fill_form(chromium, out / "form.html", who, letters, tmp_path / f"dl{i}", tmp_path / f"prof{i}"))
    saved = json.loads(files[0].read_text())
    assert saved["annotator"] == "ann1" and saved["form_id"] == key[ids[0]]["form_id"] and len(saved["choices"]) == 8
    filled = tmp_path / "ann3.csv"
    with filled.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["pair_id", "context", "response_a", "response_b", "choice"])
        w.writeheader()
        for p, o in zip(sorted(pairs, key=lambda p: p["pair_id"]), plan["ann3"]):
            w.writerow({**p, "choice": letter(p["pair_id"], o)})
    files.append(filled)

    res = escrag("import-human", "--run", str(run_dir), *map(str, files))
    assert res.returncode == 0, res.stderr
    results = json.loads((run_dir / "human" / "results.json").read_text())
    assert results["annotators"] == ["ann1", "ann2", "ann3"]
    for comp in results["comparisons"]:
        mine = [i for i, pid in enumerate(ids) if comp["baseline"] in (key[pid]["system_a"], key[pid]["system_b"])]
        votes = [[plan[a][i] for a in ("ann1", "ann2", "ann3")] for i in mine]
        expect = Counter(majority(v) for v in votes)
        assert (comp["win"], comp["tie"], comp["loss"]) == tuple(expect.get(o, 0) for o in OUTCOMES)
        kappa = fleiss_kappa([[v.count(o) for o in OUTCOMES] for v in votes])
        assert comp["kappa"] == pytest.approx(kappa, abs=1e-4) and comp["pairs"] == len(mine) == 4
    all_votes = [[plan[a][i] for a in ("ann1", "ann2", "ann3")] for i in range(8)]
    assert results["kappa_overall"] == pytest.approx(
        fleiss_kappa([[v.count(o) for o in OUTCOMES] for v in all_votes]), abs=1e-4)
    assert (run_dir / "human" / "figure4.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Fleiss' kappa" in (run_dir / "human" / "human.md").read_text()


def test_import_rejects_bad_files(tmp_path):
    run_dir, out = make_run(tmp_path), tmp_path / "annotators"
    assert escrag("export-human", "--run", str(run_dir), "--out", str(out)).returncode == 0
    key = list(csv.DictReader((run_dir / "human" / "key.csv").open()))
    form_id, pid = key[0]["form_id"], key[0]["pair_id"]

    def annotation(name, **kw):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"form_id": form_id, "annotator": name, "choices": {pid: "A"}, **kw}))
        return str(path)
    cases = [
        ([annotation("x", form_id="0000")], "saved from form '0000'"),
        ([annotation("y", choices={"p9999": "A"})], "pair 'p9999' is not in this run's key"),
        ([annotation("z", choices={pid: "left"})], "choice must be one of A, B, tie"),
        ([annotation("w"), str(shutil.copy(annotation("w"), tmp_path / "w2.json"))], "appears in two files"),
        ([str(tmp_path / "missing.json")], "no such annotation file"),
    ]
    for files, needle in cases:
        res = escrag("import-human", "--run", str(run_dir), *files)
        assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert escrag("import-human", "--run", str(tmp_path / "nope"), annotation("v")).returncode == 2


def test_csv_import_validates_like_json(tmp_path):
    """A filled CSV must come from this run's form (its pairs hash to the key's form id, as the JSON
    path checks), hold every pair once, and have whole rows; each problem is one clear error."""
    from escrag.errors import UserError
    from evaluation.human import read_annotations, read_key

    run_dir, out = make_run(tmp_path), tmp_path / "annotators"
    assert escrag("export-human", "--run", str(run_dir), "--out", str(out)).returncode == 0
    key, rows = read_key(run_dir), list(csv.DictReader((out / "pairs.csv").open()))
    fields = ["pair_id", "context", "response_a", "response_b", "choice"]

    def filled(name, rows, fields=fields, extra=""):
        path = tmp_path / f"{name}.csv"
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
            w.writeheader()
            w.writerows({"choice": "A", **r} for r in rows)
            fh.write(extra)
        return path

    good = read_annotations([filled("good", rows[::-1])], key)  # any row order
    assert good == {"good": {r["pair_id"]: "A" for r in rows}}
    edited = [{**rows[0], "response_a": rows[0]["response_a"] + " (edited)"}] + rows[1:]
    cases = [
        (filled("other", edited), "not those of this run's form"),
        (filled("dup", rows + rows[:1]), "appears twice"),
        (filled("short", rows, extra=f"{rows[0]['pair_id']},only two\n"), "fewer cells than the header"),
        (filled("few", rows[:-1]), f"holds {len(rows) - 1} of the form's {len(rows)} pairs"),
        (filled("nochoice", rows, fields[:-1]), "missing choice"),
    ]
    for path, needle in cases:
        with pytest.raises(UserError, match=needle):
            read_annotations([path], key)
