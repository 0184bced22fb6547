"""ESC-Preference construction (paper 3.2): ``build`` (the builder, dominance filter and outputs of
``escrag prefs build``). Reaches models only through ``escrag.llm``."""
