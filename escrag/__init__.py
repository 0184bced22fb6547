"""escrag: the domain core of ESCRAG-R1 (data, prompts, output format, config, models, CLI).

Kept free of heavy imports: importing ``escrag`` loads neither torch nor faiss."""

__version__ = "0.1.0"
