"""Evaluation (paper 4.1-4.4): the seven-metric judge tables, the ablation, the retrieval-number sweep,
the offline proxy report and the blind pairwise human study. See docs/evaluation.md.

Layer: imports the core (``escrag``), the shared two-stage path (``rollout.episode``), the service
clients, the manifest readers of the index and reward-model folders, and ``reward_server.train`` for
the proxy reward model; nothing imports it but the CLI, which dispatches to it by name.
"""
