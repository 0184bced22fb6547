"""The ``escrag`` command line.

Owns: the command tree and argument parsing only. Each command's work lives in the module that owns
it and is imported when the command runs, so ``escrag --help`` stays fast and free of torch/faiss.
Handlers take the parsed ``argparse.Namespace`` and return an exit code; ``escrag.errors.run_main``
turns the project's errors into one clear line (exit 2 for the user's input), without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from escrag.errors import run_main


def _lazy(target: str):
    """A handler that imports ``module:function`` only when the command runs."""
    def run(args):
        module, func = target.split(":")
        return getattr(importlib.import_module(module), func)(args)
    return run


def _config_args(p: argparse.ArgumentParser, default: str | None = None) -> None:
    p.add_argument("--config", default=default, help="YAML preset (configs/*.yaml)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. -o grpo.lr=2e-6 (repeatable)")


def _server_args(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    p.add_argument("--port", type=int, default=port)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' (or set ESCRAG_API_KEY)")


def _data(sub) -> None:
    data = sub.add_parser("data", help="ESConv data").add_subparsers(dest="data_cmd", required=True)
    p = data.add_parser("stats", help="dialogues, states, mean turns and strategies per split")
    p.add_argument("--split", action="append", help="split name or ESConv JSONL path (repeatable); "
                   "default: train, valid and test")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_lazy("escrag.stats:main"))


def _index(sub) -> None:
    idx = sub.add_parser("index", help="retrieval corpus and FAISS index").add_subparsers(
        dest="index_cmd", required=True)
    p = idx.add_parser("build", help="build the exemplar corpus and its index")
    p.add_argument("--source", choices=("esconv", "prefs"), default=None)
    p.add_argument("--pairs", default=None, help="ESC-Preference JSONL (with --source prefs)")
    p.add_argument("--out", default=None, help="index folder (default: <output_dir>/index)")
    p.add_argument("--embedder", default=None, help="embedder spec (default: packaged:minilm)")
    p.add_argument("--index-type", choices=("flat", "hnsw", "ivf"), default=None)
    p.add_argument("--limit", type=int, default=None, metavar="N", help="keep only the first N chunks")
    _config_args(p)
    p.set_defaults(func=_lazy("retriever_server.build:main"))


def _prefs(sub) -> None:
    prefs = sub.add_parser("prefs", help="preference pairs").add_subparsers(dest="prefs_cmd", required=True)
    p = prefs.add_parser("bootstrap", help="silver pairs from ESConv train (stand-in for ESC-Preference)")
    p.add_argument("--out", required=True)
    p.add_argument("--split", default="train")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-pairs", type=int, default=None)
    p.add_argument("--negatives", default=None, metavar="KIND,KIND", help="negative kinds (escrag/pairs.py "
                   "NEGATIVE_KINDS; default: reward.silver_negatives' default)")
    p.add_argument("--per-state", type=int, default=1, help="pairs per state, of distinct negative kinds")
    p.set_defaults(func=_lazy("escrag.pairs:bootstrap_main"))
    p = prefs.add_parser("build", help="ESC-Preference: simulated client, three-stage counselor reasoning, "
                         "judge, dominance filter (docs/preference.md)")
    _config_args(p)
    p.set_defaults(func=_lazy("escrag.preference.build:build_main"))


def _rm(sub) -> None:
    rm = sub.add_parser("rm", help="reward model").add_subparsers(dest="rm_cmd", required=True)
    p = rm.add_parser("train", help="train the linear head on cached frozen-backbone features")
    p.add_argument("--pairs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--backbone", default=None)
    _config_args(p)
    p.set_defaults(func=_lazy("reward_server.train:main"))


def _serve(sub) -> None:
    serve = sub.add_parser("serve", help="HTTP services").add_subparsers(dest="serve_cmd", required=True)
    p = serve.add_parser("retriever", help="POST /retrieve over a built index")
    p.add_argument("--index", required=True, help="index folder from `escrag index build`")
    p.add_argument("--embedder", default=None,
                   help="embedder spec; must be the one the index was built with (default: retriever.embedder)")
    _server_args(p, 8101)
    _config_args(p)
    p.set_defaults(func=_lazy("retriever_server.server:main"))
    p = serve.add_parser("reward", help="POST /score and /get_reward with a trained head")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--rm", help="reward-model folder from `escrag rm train`")
    which.add_argument("--rule", metavar="NAME[:ARG]",
                       help="serve a rule instead of the RM: keyword:WORD or length:N (reward_server/rules.py)")
    p.add_argument("--backbone", default=None,
                   help="backbone spec to check against the head's manifest (default: the manifest's)")
    _server_args(p, 8102)
    _config_args(p)
    p.set_defaults(func=_lazy("reward_server.server:main"))
    p = serve.add_parser("counselor", help="OpenAI-compatible two-stage RAG counselor")
    p.add_argument("--policy", default=None, help="model spec or checkpoint folder (or use --endpoint)")
    p.add_argument("--endpoint", default=None, metavar="BASE_URL",
                   help="answer with a remote OpenAI-compatible model instead of a local policy")
    p.add_argument("--endpoint-model", default=None, metavar="NAME", help="model name for --endpoint")
    p.add_argument("--endpoint-key-env", default=None, metavar="VAR",
                   help="environment variable holding the API key for --endpoint")
    p.add_argument("--retriever", default=None, help="retriever URL (required unless --no-rag)")
    p.add_argument("--no-rag", action="store_true", help="one-stage answers, no retrieval")
    _server_args(p, 8100)
    _config_args(p)
    p.set_defaults(func=_lazy("rollout.counselor.server:main"))


def _train(sub) -> None:
    p = sub.add_parser("sft", help="cold-start SFT in the think/response format (eq. 6)")
    p.add_argument("--data", default=None, help="demonstrations JSONL (default: bootstrap from ESConv)")
    p.add_argument("--out", default=None)
    _config_args(p)
    p.set_defaults(func=_lazy("trainer.sft:main"))
    p = sub.add_parser("pipeline", help="pairs -> index -> reward model -> cold-start SFT -> GRPO, skipping "
                       "finished stages (same as python -m ray_jobs.pipeline)")
    p.add_argument("--until", default=None, choices=("pairs", "index", "rm", "sft", "grpo"),
                   help="stop after this stage")
    _config_args(p, default="configs/cpu-demo.yaml")
    p.set_defaults(func=_lazy("ray_jobs.pipeline:run_cli"))
    p = sub.add_parser("grpo", help="retrieval-augmented GRPO (same as python -m ray_jobs.train_grpo)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    p.add_argument("--backend", choices=("local", "openrlhf"), default=None,
                   help="local: this machine's learner; openrlhf: OpenRLHF on a GPU cluster (docs/cluster.md); "
                        "default: grpo.backend")
    p.add_argument("--policy", default=None, help="openrlhf: start from this model (default <output_dir>/sft)")
    p.add_argument("--dry-run", action="store_true", help="print the placement plan and write placement.json "
                   "(openrlhf: also the prompt files and, last, the command), then exit")
    p.add_argument("--gpus", default=None, metavar="NxGiB", help="the GPUs to plan for, e.g. 2x80")
    p.add_argument("--tokenizer", default=None, metavar="SPEC", help="--dry-run: render the prompt file with it")
    _config_args(p, default="configs/cpu-demo.yaml")
    p.set_defaults(func=_lazy("ray_jobs.train_grpo:run_cli"))


def _safety(sub) -> None:
    safety = sub.add_parser("safety", help="the crisis check").add_subparsers(dest="safety_cmd", required=True)
    p = safety.add_parser("eval", help="confusion table per category on a labelled set (docs/safety.md)")
    p.add_argument("--data", default="eval", help="cases JSONL, or 'eval' / 'tuning' (data/safety/); default eval")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the result as JSON")
    p.add_argument("--guard", nargs="?", const="config", default=None, metavar="URL",
                   help="also score the embedded check combined with a guard model: safety.guard of the config, "
                        "or URL (up to /v1) as its chat (Llama Guard answers) and moderation endpoint")
    _config_args(p)
    p.set_defaults(func=_lazy("escrag.safety.cli:eval_main"))
    p = safety.add_parser("fit-heads", help="fit the config's heads anew and ship them in data/safety/heads/")
    _config_args(p)
    p.set_defaults(func=_lazy("escrag.safety.cli:fit_heads_main"))


def _eval(sub) -> None:
    p = sub.add_parser("eval", help="judge tables, offline proxy and human study (docs/evaluation.md)")
    _config_args(p)
    p.set_defaults(func=_lazy("evaluation.run:main"))
    ev = p.add_subparsers(dest="eval_cmd")
    e = ev.add_parser("export-human", help="blind pairs (pairs.csv, form.html); the key stays in the run")
    e.add_argument("--run", required=True, help="run folder of `escrag eval`")
    e.add_argument("--out", required=True, help="folder for the annotators' files")
    e.set_defaults(func=_lazy("evaluation.human:export_main"))
    i = ev.add_parser("import-human", help="filled forms -> win/tie/loss, Fleiss' kappa, figure4.png")
    i.add_argument("--run", required=True, help="run folder of `escrag eval` (holds the key)")
    i.add_argument("files", nargs="+", help="annotation files saved by form.html (or filled CSVs)")
    i.set_defaults(func=_lazy("evaluation.human:import_main"))
    r = ev.add_parser("proxy-rm", help="train the proxy RM on train dialogues disjoint from the training RM's")
    r.add_argument("--out", required=True, help="folder of the proxy reward model")
    _config_args(r)
    r.set_defaults(func=_lazy("evaluation.proxy:proxy_rm_main"))
    lb = ev.add_parser("labels", help="rewards against ESConv's human labels on held-out dialogues; the MiniLM proxy")
    lb.add_argument("--rm", action="append", default=[], help="NAME=HEAD_DIR of a reward head to check (repeatable)")
    lb.add_argument("--split", choices=("valid", "test"), default="test")
    lb.add_argument("--answers", help="also judge a comparison's saved answers (<run>/grpo/compare-<split>.jsonl)")
    lb.add_argument("--generic", metavar="FILE", help="also: how often a generic reply of FILE (one a line) "
                    "outscores the gold turn")
    lb.add_argument("--out", required=True, help="the JSON report")
    _config_args(lb)
    lb.set_defaults(func=_lazy("evaluation.labels:main"))


def _config(sub) -> None:
    config = sub.add_parser("config", help="configuration presets").add_subparsers(dest="config_cmd", required=True)
    p = config.add_parser("show", help="print the resolved config, one 'section.key: value  # help' a line")
    p.add_argument("file", nargs="?", default=None, metavar="FILE",
                   help="YAML preset (configs/*.yaml); default: the built-in defaults")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. -o grpo.lr=2e-6 (repeatable)")
    p.set_defaults(func=_lazy("escrag.config.show:show_main"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="escrag", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for add in (_data, _index, _prefs, _rm, _serve, _train, _eval, _safety, _config):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_main("escrag", lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
