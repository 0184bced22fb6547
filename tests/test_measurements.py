"""docs/measurements.md is what bench/report.py renders from the JSON, and holds no number typed by hand."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_report", ROOT / "bench" / "report.py")
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

# a number as the page writes it: not part of a name (b8, float32, r16), thousands with commas
NUMBER = re.compile(r"(?<![\w.])([+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)(×)?(?![\w])")


def _numbers(value, out: list[float]) -> None:
    """Every number a JSON value holds: numeric leaves, numbers inside strings, list lengths."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        out.append(float(value))
    elif isinstance(value, str):
        out.extend(float(m.group(1).replace(",", "")) for m in NUMBER.finditer(value))
    elif isinstance(value, dict):
        for k, v in value.items():
            _numbers(k, out)
            _numbers(v, out)
    elif isinstance(value, list):
        out.append(float(len(value)))
        for v in value:
            _numbers(v, out)


def json_numbers() -> list[float]:
    out: list[float] = []
    for path, _ in itertools.chain.from_iterable(report.SOURCES.values()):
        _numbers(json.loads((ROOT / path).read_text()), out)
    return sorted(set(out))


def _shown(x: float, digits: int) -> str:
    s = f"{x:.{digits}f}"
    return s[1:] if re.fullmatch(r"-0\.?0*", s) else s  # -0.000 is shown as 0.000


def _key(token: str) -> tuple[str, int]:
    plain = token.replace(",", "").lstrip("+")
    return plain, len(plain.split(".")[1]) if "." in plain else 0


def unexplained(page: str, numbers: list[float]) -> list[str]:
    """The numbers of the page's table rows that are neither a JSON number nor (marked ×) the ratio of
    two JSON numbers shown in the same row."""
    bad = []
    for line in page.splitlines():
        if not line.startswith("|") or set(line) <= set("|- "):
            continue
        tokens = [(m.group(1), bool(m.group(2))) for m in NUMBER.finditer(line)]
        shown = {}
        for token, _ in tokens:
            plain, digits = _key(token)
            shown.setdefault((plain, digits), [x for x in numbers if _shown(x, digits) == plain])
        values = [x for (_, _), xs in shown.items() for x in xs]
        for token, is_ratio in tokens:
            plain, digits = _key(token)
            if shown[(plain, digits)]:
                continue
            if is_ratio and any(b and _shown(a / b, digits) == plain for a in values for b in values):
                continue
            bad.append(f"{token} in: {line[:120]}")
    return bad


def test_the_page_is_what_the_json_renders():
    page = (ROOT / report.PAGE).read_text()
    assert page == report.render(), "docs/measurements.md is stale: run python bench/report.py"


def test_check_mode_passes_on_the_committed_page():
    assert report.main(["--check"]) == 0


def test_every_number_in_the_tables_comes_from_the_json():
    page = (ROOT / report.PAGE).read_text()
    assert unexplained(page, json_numbers()) == []


def test_the_number_check_catches_a_typed_number():
    numbers = json_numbers()
    typed = "| engine, typed by hand | 123.457 tok/s | 61.2 tok/s | 9.87× | not recorded | x.json | `cmd` |"
    found = unexplained(typed, numbers)
    assert any(t.startswith("123.457") for t in found) and any(t.startswith("9.87") for t in found)


def test_every_bench_result_is_rendered_or_skipped_with_a_reason():
    read = {path for path, _ in itertools.chain.from_iterable(report.SOURCES.values())}
    results = {p.relative_to(ROOT).as_posix() for p in (ROOT / "bench" / "results").glob("*.json")}
    assert results - read - set(report.SKIPPED) == set()
    assert set(report.SKIPPED) <= results, "SKIPPED names a file that is gone"


def test_the_demo_quotes_its_expected_time_from_the_same_json():
    """``make demo``'s first line names the time to expect on its CPU class from bench/results/wall_times.json,
    the file the README's table and this page render: one source, not a number typed into the job."""
    from ray_jobs.demo import WALL_TIMES, expected_run

    rows = [r for r in json.loads(WALL_TIMES.read_text())["rows"] if r["what"] == "make demo"]
    assert {r["cpu_class"] for r in rows} >= {"avx512-bf16", "avx2"}
    for cpu in {r["cpu_class"] for r in rows}:
        assert expected_run(cpu) == [r for r in rows if r["cpu_class"] == cpu][-1]
