"""The transformers generation engine (CPU or one GPU): continuous batching over a slot KV cache.

Owns: ``HFEngine`` (sync ``generate``, ``scheduler()`` for concurrent async callers, ``load_weights``,
``warmup``) and the prefix cache of finished rows' K/V. The tensor side (slots, prefill, the
compiled decode step with sampling inside) is ``rollout/engines/decoder.py``.

The engine thread. All of the engine's torch work (model load, weight loads, warmup, prefill and
decode) runs on one thread that the engine owns (``call`` runs more there). Why: PyTorch's CPU ops
fork and join on an OpenMP pool owned by the thread that calls them, and libgomp's workers only spin
between ops (fast hand-off) while its threads number no more than the cores; a second thread running
parallel torch ops adds a pool, every worker then sleeps between ops, and each op pays a futex wake:
on this 2-core CPU a SmolLM2 decode step at batch 8 took 68 ms instead of 38 ms. The thread ends
when the engine is closed or garbage-collected.

How a batch runs. Requests (sync or async) queue their rows; the engine thread loops: admit waiting
rows into free slots (one batched prefill of their prompts, first token), run one decode step for the live rows, retire the rows
that finished (EOS, a stop string, ``max_new_tokens``, or ``rollout.max_seq_len``) and move the last
live rows into their slots, so finished rows cost nothing and live rows stay packed in [0, n). A
request's future resolves when its last row finishes; meanwhile rows of other requests join, so an
episode that waits on HTTP never idles the engine. Rows in one decode step share temperature, top-p
and top-k (the compiled step is specialised on them); a waiting row with other values enters when
the batch has drained.

Precision: weights in ``rollout.dtype`` (auto: bfloat16 where the hardware multiplies it fast,
``escrag.models.engine_dtype``); when that differs from the learner's ``policy.dtype`` the learner
recomputes π_old (``trainer.learner.recompute_old``) and ``logp_diff`` shows the gap.

Batch invariance (``rollout.batch_invariant``): every decode step runs ``max_batch`` rows (padding rows
at position 0 of free slots), each row entering gets a prefill pass of its own (all waiting rows enter
before the next step), and no row reuses a cached prefix. Then a row's tokens and log-probs depend
only on its prompt, seed, sampling params and ``max_batch``, not on which rows decode beside it or
when they arrive: a kernel's shape, and with it its blocking and threading, never depends on the
other rows. Without it
they do, by a rounding error that can flip a near-tied draw (SmolLM2 on this CPU, 24 rows: 3 differ
from their run alone, in bfloat16 compiled; a batched prefill pass, copied K/V and the decode step's
row count each move rows). Bitwise in float32 and bfloat16 on a CPU, eager and compiled, where the native attention
kernels run (``cpu_attention.py``: a row reads only its own K/V; tests/test_engine_continuous.py checks
rows against their run alone); through SDPA (a GPU, float16) every row attends the longest live row's
length, so rows match up to rounding only. The price: a step costs
``max_batch`` rows however many are live, and prompts sharing a prefix each prefill it whole (32 rows
of 90-320-token prompts, max_batch 32, 96 tokens, bf16 compiled: 11.0 s vs 8.9 without the option).
Compiled, its one-row prefill passes run eagerly and its step is the graph compiled without the
option (``SlotDecoder.prefill``, ``decode``): nothing more to compile.

Prefix cache: a new row copies the K/V of the longest prefix of its prompt that a live row or a
recently finished row (``rollout.prefix_cache_tokens``) already computed, or a row entering with it
(``_admit``), and prefills only the rest. The N samples of a stage-1 prompt prefill it once, prompts
sharing the system prompt compute it once, and a stage-2 prompt (p1 + ĉ + feedback) reuses
the K/V of its own stage-1 row. Copied K/V equal recomputed K/V up to the rounding of a different
matmul shape.

Sampling and EOS: ``escrag.sampling.sample`` (temperature, top-k first and top-p inside the top k, one
seed per row; design section 5: HF's full-vocabulary sort costs 32-36 ms per step at batch 8 on this
CPU, the top-64-then-top-p sampler ~1.25 ms); greedy when temperature is 0. EOS is kept as the last
completion token (the learner trains the stop decision); a stop string ends the row right after it.
Departure from HF ``generate``: with ``top_k`` > 0, top-p only sees the top k tokens; in 6-12% of rows
the top 64 hold under 95% of the mass, so the sampled distribution is slightly sharper there;
``rollout.top_k: 0`` restores the full-vocabulary top-p.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
import weakref
from collections import OrderedDict, deque

import numpy as np
import torch

from escrag.models import load_causal_lm, load_tokenizer, resolve_device
from escrag.sampling import sample
from rollout.engines.base import Generation, GenerationEngine, SamplingParams, stop_position
from rollout.engines.decoder import SlotDecoder

STOP_TAIL_TOKENS = 16  # tokens decoded per step to look for a stop string that just completed
MIN_REUSE = 16  # shortest cached prefix worth copying instead of recomputing
PREFILL_TOKENS = 4096  # tokens of one batched prefill pass (packed: no padding)
PREFILL_ROWS_X_LONGEST = 4 * PREFILL_TOKENS  # attention's [rows, longest row] layout of a pass


class HFEngine(GenerationEngine):
    def __init__(self, model_spec: str, ro, dtype: str = "float32", seed: int = 0):
        """``ro``: the ``RolloutConfig``; ``dtype``: the engine's weights dtype, already resolved."""
        self.device, self.max_batch, self.version, self.dtype = resolve_device(ro.device), ro.max_batch, 0, dtype
        self.invariant = ro.batch_invariant
        self.tokenizer = load_tokenizer(model_spec)
        self.prefix_cache = PrefixCache(ro.prefix_cache_tokens)
        self._seed_rng = random.Random(seed)
        self._queue = threading.Condition()  # guards _waiting, _tasks and _closed
        self._waiting: deque[_Row] = deque()
        self._tasks: deque[_Task] = deque()  # torch work for the engine thread (load, weights, warmup)
        self._closed = False
        self._live: list[_Row] = []  # row i decodes in slot i; only the engine thread touches it
        self._entering: list[_Row] = []  # rows being admitted (``_admit``)
        self._front: AsyncFront | None = None
        # steps: decode passes; decode_rows: live rows over them; joined_running: rows admitted while
        # others were mid-decode; prefill_passes: batched prefills; prefill_tokens / reused_tokens:
        # prompt tokens computed / copied; prefill_s / decode_s: seconds in the decoder's passes
        self.stats = dict.fromkeys(("steps", "decode_rows", "joined_running", "prefill_passes", "prefill_tokens",
                                    "reused_tokens", "prefill_s", "decode_s"), 0)
        self._thread = threading.Thread(target=_engine_thread, args=(weakref.ref(self), self._queue),
                                        name="hf-engine", daemon=True)
        self._thread.start()
        self.call(self._load, model_spec, ro, dtype)

    def _load(self, model_spec: str, ro, dtype: str) -> None:
        self.model = load_causal_lm(model_spec, dtype).to(self.device).eval()
        self._named = self.model.state_dict(keep_vars=True)  # tied names map to the same tensor
        self.decoder = SlotDecoder(self.model, ro)
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {i for i in [*eos, self.tokenizer.eos_token_id] if i is not None}

    # ------------------------------------------------------------------ public

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[Generation]:
        done = threading.Event()
        request = self.submit(prompt_ids, params, seeds, done.set)
        done.wait()
        return request.result()

    def scheduler(self) -> AsyncFront:
        """The engine's async front (one per engine): ``await generate(prompt_ids, params, seeds)``."""
        if self._front is None:
            self._front = AsyncFront(self)
        return self._front

    def submit(self, prompt_ids: list[list[int]], params: SamplingParams, seeds: list[int] | None,
               on_done) -> Request:
        """Queue one request; ``on_done()`` is called from the runner thread when all its rows are
        done (or it failed); then ``request.result()`` returns the generations or raises."""
        for p in prompt_ids:
            if not p:
                raise ValueError("every prompt needs at least one token")
            if len(p) >= self.decoder.max_seq_len:
                raise ValueError(f"prompt of {len(p)} tokens: rollout.max_seq_len is "
                                 f"{self.decoder.max_seq_len} (prompt + completion)")
        request = Request(params, on_done)
        request.rows = [_Row(request, list(p), s) for p, s in zip(prompt_ids, self.row_seeds(len(prompt_ids), seeds))]
        if not request.rows:
            on_done()
            return request
        with self._queue:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._waiting.extend(request.rows)
            self._queue.notify()
        return request

    def call(self, fn, *args):
        """Run ``fn(*args)`` on the engine thread (between decode steps) and return its result. All
        of the engine's torch work runs there (module doc: one OpenMP pool); so can a caller's own
        CPU torch work that shares the process (the rollout worker's crisis check, a benchmark's
        baseline)."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        task = _Task(fn, args)
        with self._queue:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._tasks.append(task)
            self._queue.notify()
        return task.result()

    def close(self) -> None:
        """Stop the engine thread (requests in flight fail). Also happens when the engine is
        garbage-collected."""
        with self._queue:
            self._closed = True
            self._queue.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def warmup(self, params: SamplingParams) -> float:
        """Run a prefill pass once and compile (or run once) the decode step for these sampling
        parameters: one graph serves every batch size and length. Returns the seconds it took; runs on
        free slots of an idle engine."""
        return self.call(self._warmup, params)

    def _warmup(self, params: SamplingParams) -> float:
        if self._live:
            raise RuntimeError("warmup needs an idle engine")
        self.decoder.reserve(2)
        t = time.perf_counter()
        self.decoder.prefill(0, [[0, 0], [0, 0, 0]], [0, 0])
        self.decoder.decode([0, 0], [1, 1], [0, 0], [1, 1], params.temperature, params.top_p, params.top_k)
        return time.perf_counter() - t

    def load_weights(self, weights: dict, version: int) -> None:
        """Copy ``weights`` (state-dict names -> tensors) into the model's own tensors, in place, so
        compiled graphs (which read the parameters as inputs) see them; all names and shapes are
        checked before anything is copied, so a bad dict leaves the engine unchanged. Rows decoding
        meanwhile continue with the new weights from the next step on; callers that need one version
        per batch load between batches (``rollout.worker``). Cached prefixes are dropped."""
        self.call(self._load_weights, weights, version)

    def _load_weights(self, weights: dict, version: int) -> None:
        self._check_version(version)
        unknown = sorted(set(weights) - set(self._named))
        if unknown:
            raise KeyError(f"unknown parameter names: {unknown[:5]} ({len(unknown)} in all)")
        for name, tensor in weights.items():
            if tuple(tensor.shape) != tuple(self._named[name].shape):
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != "
                                 f"{tuple(self._named[name].shape)}")
        with torch.no_grad():
            for name, tensor in weights.items():
                target = self._named[name]
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        self.decoder.repack([self._named[name] for name in weights])
        self.prefix_cache.clear()
        self.version = version

    # ------------------------------------------------------------------ the runner

    def _work(self) -> None:
        """One turn of the engine thread: run queued tasks, then one iteration of the batch."""
        with self._queue:
            tasks, self._tasks = self._tasks, deque()
        for task in tasks:
            task.run()
        if not self._live and not self._waiting:
            return
        try:
            finished = self._iterate()
        except BaseException as exc:  # noqa: BLE001  every request in flight sees the failure
            self._fail_all(exc)
            return
        for request in finished:
            request.on_done()

    def _idle(self) -> bool:
        """Under ``_queue``: nothing to do."""
        return not (self._tasks or self._waiting or self._live)

    def _iterate(self) -> list[Request]:
        """Admit waiting rows, run one decode step, retire finished rows; returns finished requests."""
        done = self._admit()
        if self._live:
            done += self._step()
        return [r.request for r in done if r.request.row_done()]

    def _admit(self) -> list[_Row]:
        """Move waiting rows into free slots, then sample each row's first token. Each row copies the
        K/V of the longest prefix of its prompt that a live row, the prefix cache or a row entering with
        it computes (``_plan``); rows enter in prefill passes by depth: first those that copy from no
        entering row, then those that copy from them, and so on (a pass per row under
        ``rollout.batch_invariant``). So rows sharing a system prompt compute it once, and the N
        samples of a prompt prefill it once."""
        live, rows, plans = self._live, [], []
        self._entering = rows  # off the queue, not yet live: failed with the others if a pass raises
        while len(live) + len(rows) < self.max_batch:
            with self._queue:
                if not self._waiting or self._waiting[0].key != (live or rows or self._waiting)[0].key:
                    break
                row = self._waiting[0]
            plan = self._plan(row, rows, plans)
            if rows and not self.invariant and not self._fits(row, plan, rows, plans):
                break
            with self._queue:
                self._waiting.popleft()
            rows.append(row)
            plans.append(plan)
        if not rows:
            return []
        self.stats["joined_running"] += len(rows) * any(len(r.token_ids) > 1 for r in live)
        order = sorted(range(len(rows)), key=lambda i: plans[i][2])  # by depth; stable
        rows, plans = [rows[i] for i in order], [plans[i] for i in order]
        logits = self._prefill(rows, plans)
        p = rows[0].request.params
        toks, logps = sample(logits, p.temperature, p.top_p, p.top_k, torch.tensor([r.seed for r in rows]),
                             torch.zeros(len(rows), dtype=torch.long))
        first = len(live)
        live.extend(rows)
        self._entering = []
        finished = [first + i for i, (r, t, lp) in enumerate(zip(rows, toks.tolist(), logps.tolist()))
                    if self._advance(r, t, lp)]
        done = [live[i] for i in finished]
        self._retire(finished)
        return done

    def _prefill(self, rows: list[_Row], plans: list[tuple]) -> torch.Tensor:
        """Prefill ``rows`` (sorted by depth) into the slots after the live rows, a pass per depth (a
        pass per row under ``rollout.batch_invariant``), each row's cached prefix copied in first;
        returns the logits after each prompt, [len(rows), vocab]."""
        first = len(self._live)
        self.decoder.reserve(first + len(rows))
        slot = {id(r): first + i for i, r in enumerate(rows)}
        logits = []
        for _, group in itertools.groupby(range(len(rows)), key=lambda i: plans[i][2]):
            group = list(group)
            lo, hi = group[0], group[-1] + 1
            for i in group:
                start, source, _ = plans[i]
                if isinstance(source, _Row):  # a row of an earlier pass: now in its slot
                    source = slot[id(source)]
                if isinstance(source, int):
                    self.decoder.copy(source, first + i, start)
                elif source is not None:
                    self.decoder.restore(source, first + i, start)
                self.stats["prefill_tokens"] += len(rows[i].prompt) - start
                self.stats["reused_tokens"] += start
            t = time.perf_counter()
            if self.invariant:  # a batched pass runs other kernel shapes (module doc)
                logits += [self.decoder.prefill(first + i, [rows[i].prompt], [0]) for i in range(lo, hi)]
            else:
                logits.append(self.decoder.prefill(first + lo, [r.prompt for r in rows[lo:hi]],
                                                   [start for start, _, _ in plans[lo:hi]]))
            self.stats["prefill_s"] += time.perf_counter() - t
            self.stats["prefill_passes"] += hi - lo if self.invariant else 1
        return torch.cat(logits)

    def _plan(self, row: _Row, rows: list[_Row], plans: list[tuple]) -> tuple[int, object, int]:
        """(start, source, depth): the longest prefix of ``row``'s prompt to copy, where from (a live
        slot, saved K/V, a row entering before it, or None) and the prefill pass it joins (one deeper
        than the entering row it copies from, else 0)."""
        start, source = self._reuse(row)
        depth = 0
        if self.invariant:
            return start, source, depth
        for other, (_, _, d) in zip(rows, plans):
            n = common_prefix(row.prompt, other.prompt, len(row.prompt) - 1)
            if n > start:
                start, source, depth = n, other, d + 1
        return start, source, depth

    def _reuse(self, row: _Row) -> tuple[int, int | torch.Tensor | None]:
        """The longest cached prefix of ``row``'s prompt: (length, live slot or saved K/V); (0, None)
        when shorter than ``MIN_REUSE``."""
        if self.invariant:
            return 0, None
        prompt, best, source = row.prompt, 0, None
        for i, other in enumerate(self._live):  # live rows: K/V valid for positions < pos
            n = common_prefix(prompt, other.tokens(), min(other.pos, len(prompt) - 1))
            if n > best:
                best, source = n, i
        hit = self.prefix_cache.find(prompt, len(prompt) - 1)
        if hit[0] > best:
            best, source = hit
        return (best, source) if best >= MIN_REUSE else (0, None)

    def _fits(self, row: _Row, plan: tuple, rows: list[_Row], plans: list[tuple]) -> bool:
        """Whether ``row`` enters with ``rows``: not past its pass's token budget, nor its attention
        layout's (rows x the longest row)."""
        start, _, depth = plan
        lens = [len(row.prompt) - start, *(len(r.prompt) - p[0] for r, p in zip(rows, plans) if p[2] == depth)]
        return sum(lens) <= PREFILL_TOKENS and len(lens) * max(lens) <= PREFILL_ROWS_X_LONGEST

    def _step(self) -> list[_Row]:
        live = self._live
        p = live[0].request.params
        t = time.perf_counter()
        toks, logps = self.decoder.decode([r.token_ids[-1] for r in live], [r.pos for r in live],
                                          [r.seed for r in live], [len(r.token_ids) for r in live],
                                          p.temperature, p.top_p, p.top_k)
        self.stats["decode_s"] += time.perf_counter() - t
        self.stats["steps"] += 1
        self.stats["decode_rows"] += len(live)
        finished = [i for i, (row, t, lp) in enumerate(zip(live, toks, logps)) if self._advance(row, t, lp)]
        done = [live[i] for i in finished]
        self._retire(finished)
        return done

    def _advance(self, row: _Row, token: int, logprob: float) -> bool:
        """Append a sampled token; True when the row is finished."""
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        params = row.request.params
        if token in self.eos_ids:
            row.reason, row.eos = "stop", True
        elif params.stop_strings:
            tail = self.tokenizer.decode(row.token_ids[-STOP_TAIL_TOKENS:], skip_special_tokens=True)
            if stop_position(tail, params.stop_strings) is not None:
                row.reason = "stop"
        if row.reason is None and (len(row.token_ids) >= params.max_new_tokens
                                   or len(row.prompt) + len(row.token_ids) >= self.decoder.max_seq_len):
            row.reason = "length"
        return row.reason is not None

    def _retire(self, slots: list[int]) -> None:
        """Drop the rows in ``slots`` (kept in the prefix cache) and pack the live rows into [0, n)."""
        live = self._live
        for i in slots:
            row = live[i]
            if self.prefix_cache.capacity and row.pos >= MIN_REUSE:
                self.prefix_cache.put(row.tokens()[:row.pos], self.decoder.save(i, row.pos))
            row.generation = self._finish(row)
            live[i] = None
        keep = [r for r in live if r is not None]
        holes = [i for i in range(len(keep)) if live[i] is None]
        movers = [i for i in range(len(keep), len(live)) if live[i] is not None]
        for dst, src in zip(holes, movers):
            self.decoder.copy(src, dst, live[src].pos)
            live[dst] = live[src]
        del live[len(keep):]

    def _finish(self, row: _Row) -> Generation:
        params = row.request.params
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        cut = stop_position(text, params.stop_strings)
        if cut is not None:
            text = text[:cut]
        return Generation(row.token_ids, row.logprobs, text, row.reason or "length", row.eos)

    def _fail_all(self, exc: BaseException) -> None:
        with self._queue:
            rows = [*self._live, *self._entering, *self._waiting]
            self._live, self._entering, self._waiting = [], [], deque()
        for request in {id(r.request): r.request for r in rows}.values():
            request.error = exc
            request.on_done()


def _engine_thread(ref, queue: threading.Condition) -> None:
    """The engine thread: works while there is work, waits otherwise; ends with the engine (closed or
    garbage-collected: it holds the engine only while working)."""
    while True:
        engine = ref()
        if engine is None:
            return
        with queue:
            if engine._closed:
                break
            if engine._idle():
                del engine
                queue.wait(timeout=1.0)
                continue
        engine._work()
        del engine
    tasks, engine._tasks = engine._tasks, deque()
    for task in tasks:
        task.fail(RuntimeError("the engine is closed"))
    engine._fail_all(RuntimeError("the engine is closed"))


class _Task:
    """A call waiting for the engine thread."""

    def __init__(self, fn, args):
        self.fn, self.args, self.done = fn, args, threading.Event()
        self.value, self.error = None, None

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001  re-raised in the caller's thread
            self.error = exc
        self.done.set()

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.done.set()

    def result(self):
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if n < MIN_REUSE or a[:MIN_REUSE] != b[:MIN_REUSE]:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if len(diff) else n


class PrefixCache:
    """K/V of finished rows (token ids -> ``SlotDecoder.save`` copy), least recently used out first,
    at most ``capacity`` tokens in all (0: off)."""

    def __init__(self, capacity: int):
        self.capacity, self.tokens = capacity, 0
        self._entries: OrderedDict[int, tuple[list[int], torch.Tensor]] = OrderedDict()
        self._next = 0

    def put(self, tokens: list[int], kv: torch.Tensor) -> None:
        if len(tokens) > self.capacity:
            return
        self._entries[self._next] = (tokens, kv)
        self._next += 1
        self.tokens += len(tokens)
        while self.tokens > self.capacity:
            _, (old, _) = self._entries.popitem(last=False)
            self.tokens -= len(old)

    def find(self, prompt: list[int], limit: int) -> tuple[int, torch.Tensor | None]:
        """(length, K/V) of the entry sharing the longest prefix with ``prompt`` (at most ``limit``)."""
        best, hit = 0, None
        for key, (tokens, _) in self._entries.items():
            n = common_prefix(prompt, tokens, limit)
            if n > best:
                best, hit = n, key
        if hit is None:
            return 0, None
        self._entries.move_to_end(hit)
        return best, self._entries[hit][1]

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0


class Request:
    """One ``generate`` call: its rows, in order, and how it ends."""

    def __init__(self, params: SamplingParams, on_done):
        self.params, self.on_done = params, on_done
        self.rows: list[_Row] = []
        self.error: BaseException | None = None
        self._left = None

    def row_done(self) -> bool:
        """Count one finished row; True when it was the last."""
        self._left = (len(self.rows) if self._left is None else self._left) - 1
        return self._left == 0

    def result(self) -> list[Generation]:
        if self.error is not None:
            raise self.error
        return [r.generation for r in self.rows]


class _Row:
    __slots__ = ("request", "prompt", "seed", "token_ids", "logprobs", "reason", "eos", "generation")

    def __init__(self, request: Request, prompt: list[int], seed: int):
        self.request, self.prompt, self.seed = request, prompt, seed
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.reason: str | None = None
        self.eos = False
        self.generation: Generation | None = None

    @property
    def key(self) -> tuple:
        p = self.request.params
        return p.temperature, p.top_p, p.top_k

    @property
    def pos(self) -> int:
        """Position of the last token: the next one fed; K/V is valid for positions below it."""
        return len(self.prompt) + len(self.token_ids) - 1

    def tokens(self) -> list[int]:
        return self.prompt + self.token_ids


class AsyncFront:
    """What concurrent episodes await (``rollout.episode.as_scheduler``): each call's rows join the
    engine's running batch; the event loop keeps serving retrieval and reward calls meanwhile."""

    is_async = True

    def __init__(self, engine: HFEngine):
        self.engine = engine

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    async def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                       seeds: list[int] | None = None) -> list[Generation]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def resolve():
            if not fut.done():
                fut.set_exception(request.error) if request.error else fut.set_result(request.result())

        def on_done():
            try:
                loop.call_soon_threadsafe(resolve)
            except RuntimeError:  # the caller's loop is closed: nobody waits any more
                pass

        request = self.engine.submit(prompt_ids, params, seeds, on_done)
        return await fut
