"""HTTP schemas of the retriever (design section 3): ``POST /retrieve`` and its answer (``RetrieveResponse``,
the route's response model and what the client checks an answer against).

Owns: request validation only (pydantic, no heavy imports). Strict types: a query must be a
non-empty string, ``k`` an integer in 1..50, ``return_scores`` a boolean; unknown fields are
rejected so that a misspelt key is not silently ignored. Per-server limits (queries per request,
characters per query) are checked by the service, which knows the config.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator

MAX_K = 50


class RetrieveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    queries: list[StrictStr] = Field(min_length=1)  # one search per query, answered in order
    k: StrictInt | None = Field(default=None, ge=1, le=MAX_K)  # None: the server's retriever.k
    return_scores: StrictBool = True
    # one per query (or none): never return chunks of that dialogue (training excludes the state's own)
    exclude_dialogue_ids: list[StrictStr | None] | None = None

    @model_validator(mode="after")
    def _one_exclusion_per_query(self):
        if self.exclude_dialogue_ids is not None and len(self.exclude_dialogue_ids) != len(self.queries):
            raise ValueError(f"exclude_dialogue_ids: {len(self.exclude_dialogue_ids)} entries for "
                             f"{len(self.queries)} queries")
        return self


class Hit(BaseModel):
    id: str
    history: str
    response: str
    strategies: list[str]  # the ESConv strategies of the exemplar's counselor turn, in order
    stage: str  # the counseling stage (preference pairs), "" where the corpus has none
    problem: str  # the dialogue's ESConv problem type
    emotion: str  # the dialogue's ESConv emotion type
    score: float | None = None  # cosine similarity; omitted when return_scores is false


class RetrieveResponse(BaseModel):
    results: list[list[Hit]]  # [len(queries)][<= k], best first
