"""LLM endpoints and the judge: ``endpoint`` (an OpenAI-compatible chat client with concurrency,
rate limits, retries, a budget and a call log), ``templates`` (versioned prompt templates) and ``judge``
(the seven-metric LLM judge)."""
