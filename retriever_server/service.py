"""The retrieval logic behind ``POST /retrieve``: queries -> top-k exemplar chunks.

Owns: ``RetrieverService``. Queries from concurrent requests go through one ``MicroBatcher``; each
batch is embedded in one call (sorted by length, in forwards of ``retriever.forward_batch``: one forward
padded to the longest of queries of 10 to 150 tokens costs more than the queries alone) and searched
with one FAISS call (at the largest k of the batch, then cut per query), so many single-query clients cost about what one batched caller does. A query may
name a dialogue whose chunks it must not get back (training excludes the state's own dialogue): the
search then asks for k + the most chunks any one dialogue has, so k hits survive the filter exactly.
``search_batch`` is the same work without the batcher, for in-process callers and the benchmark.

Paper mapping: eq. 8's retriever R(ĉ): the query is the stage-1 response text, a hit is a chunk
(short history, counselor response) scored by cosine similarity, with the chunk's labels (its ESConv
strategies, stage, problem and emotion type: ``retriever_server.corpus.LABEL_FIELDS``).
"""

from __future__ import annotations

from escrag.embed import Embedder
from escrag.errors import UserError
from escrag.web.batching import MicroBatcher
from retriever_server.corpus import LABEL_FIELDS
from retriever_server.index import VectorIndex


class RetrieverService:
    def __init__(self, index: VectorIndex, embedder: Embedder, rc, on_batch=None):
        """``rc`` is the ``RetrieverConfig``; ``on_batch(n)`` is told each batch size."""
        if embedder.dim != index.manifest["dim"]:
            raise UserError(f"embedder {embedder.name!r} is {embedder.dim}-d, the index {index.manifest['dim']}-d")
        self.index, self.embedder, self.rc = index, embedder, rc
        self.batcher = MicroBatcher(self.search_batch, max_batch=rc.embed_batch_size,
                                    max_wait_ms=rc.max_wait_ms, max_queue=rc.max_queue, on_batch=on_batch)

    def health(self) -> dict:
        m = self.index.manifest
        return {"count": self.index.count, "embedder": self.embedder.name, "dim": self.embedder.dim,
                "index_type": m["index_type"], "built_at": m.get("built_at"), "k": self.rc.k}

    def search_batch(self, items: list[tuple[str, int, str | None]]) -> list[list[dict]]:
        """(query, k, excluded dialogue id or None) -> hits per query, best first: one embed call
        and one FAISS search."""
        if not items:
            return []
        vectors = self.embedder.encode([q for q, _, _ in items], batch_size=self.rc.forward_batch)
        extra = self.index.max_per_dialogue if any(x for _, _, x in items) else 0
        scores, rows = self.index.search(vectors, max(k for _, k, _ in items) + extra)
        return [self._hits(srow, rrow, k, excluded) for (_, k, excluded), srow, rrow in zip(items, scores, rows)]

    def _hits(self, scores, rows, k: int, excluded: str | None) -> list[dict]:
        chunks, hits = self.index.chunks, []
        for s, r in zip(scores, rows):
            if r < 0 or (excluded and chunks[r].get("dialogue_id") == excluded):
                continue
            c = chunks[r]
            hits.append({"id": c["id"], "history": c["history"], "response": c["response"],
                         **{key: c[key] for key in LABEL_FIELDS}, "score": float(s)})
            if len(hits) == k:
                break
        return hits

    def check(self, queries: list[str], k: int | None) -> int:
        """Limits that depend on the config; returns the effective k."""
        if len(queries) > self.rc.max_queries:
            raise UserError(f"queries: at most {self.rc.max_queries} per request, got {len(queries)}")
        for i, q in enumerate(queries):
            if not q.strip():
                raise UserError(f"queries[{i}]: must not be empty or whitespace")
            if len(q) > self.rc.max_query_chars:
                raise UserError(f"queries[{i}]: longer than {self.rc.max_query_chars} characters ({len(q)})")
        return self.rc.k if k is None else k

    async def retrieve(self, queries: list[str], k: int | None = None, return_scores: bool = True,
                       exclude_dialogue_ids: list[str | None] | None = None) -> list[list[dict]]:
        """Top-k chunks per query, through the micro-batcher (raises ``QueueFull`` when saturated)."""
        k = self.check(queries, k)
        excluded = exclude_dialogue_ids or [None] * len(queries)
        results = await self.batcher.submit([(q, k, x) for q, x in zip(queries, excluded)])
        if not return_scores:
            results = [[{key: v for key, v in hit.items() if key != "score"} for hit in hits] for hits in results]
        return results
