"""The HTTP kit every service and client shares: ``serving`` (auth, body limit, bad-input guard, 4xx
errors, ``/health``, ``/metrics``, ``serve``), ``batching`` (the micro-batcher), ``client`` (the async
JSON client), ``retry`` (the one retry policy of every outbound client) and ``procs`` (servers as
child processes, for jobs, benchmarks and tests)."""
