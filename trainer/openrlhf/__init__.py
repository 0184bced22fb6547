"""The OpenRLHF backend (``grpo.backend: openrlhf``, docs/cluster.md): ``launch`` (the command, the prompt
files, the run), ``agent`` (the two-stage episode as OpenRLHF's agent, loaded by file path) and
``ranks`` (the batch sizes OpenRLHF splits evenly over its actor ranks). The placement plan both
backends share is ``trainer/placement.py``."""
