"""escrag: the domain core of ESCRAG-R1 (data, prompts, output format, config, models, CLI).

Kept free of heavy imports and of side effects: importing ``escrag`` loads neither torch nor faiss and
changes nothing in the process (the jobs' process tuning is ``escrag.runtime.tune_process``)."""

__version__ = "0.1.0"
