"""The typed record that carries one scored group from the rollout to the learner.

Owns: ``TokenSequence``, ``Sample`` and ``ScoredGroup``. Masks are set where tokens are made (the
rollout), so the learner never works out where the retrieved exemplars or the stage-1 answer sit: it
trains exactly the tokens whose ``loss_mask`` is 1.

Paper mapping (eq. 7-11): for a dialogue state H, sample j holds one sequence: the stage-1 prompt,
ĉ_j, the feedback turn with E_j, and c_j (``rollout/episode.py``); c_j's tokens are trained with
advantage A_j. With ``rollout.train_stage1`` ĉ_j's tokens are trained too, with the same advantage:
our option, not the paper's. Vanilla GRPO (``rollout.rag: false``) is the prompt and c_j.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenSequence:
    """One sequence the learner scores: prompt, sampled spans and the feedback turn between them."""

    input_ids: list[int]  # [T] p1 + ĉ + feedback + c (RAG), or p1 + c (vanilla)
    loss_mask: list[int]  # [T] 1 on the sampled tokens that are trained (c; ĉ with train_stage1)
    old_logprobs: list[float]  # [T] behaviour log-prob (escrag.sampling) of sampled tokens; 0.0 elsewhere
    action_ranges: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of ĉ and c

    def __post_init__(self):
        if not (len(self.input_ids) == len(self.loss_mask) == len(self.old_logprobs)):
            raise ValueError("input_ids, loss_mask and old_logprobs must have the same length")


@dataclass
class Sample:
    """One of the N rollouts of a group."""

    sequence: TokenSequence  # what the learner trains
    output: str  # final policy output (stage 2, or the single stage when rag is off)
    initial_output: str = ""  # stage-1 output ĉ ("" when rag is off)
    exemplar_ids: list[str] = field(default_factory=list)  # ids of E_j, in rank order
    stage1_format_ok: bool = False  # ĉ parses (it then carries a response block for the query)
    reward: float = 0.0  # r = rm + format (eq. 5)
    rm_score: float = 0.0  # r_RM (eq. 2)
    format_reward: float = 0.0  # r_format (eq. 4)


@dataclass
class ScoredGroup:
    """N scored samples for one dialogue state, as produced by one policy version."""

    state_id: str  # "<dialogue_id>/<turn_index>", unique within a data set
    samples: list[Sample]  # [N]
    policy_version: int  # weights version that generated every sample of the group
    stats: dict = field(default_factory=dict)  # timings and token counts of the rollout

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    @property
    def is_degenerate(self) -> bool:
        """All rewards equal: zero advantage, the group adds no gradient."""
        return max(self.rewards) - min(self.rewards) == 0.0
