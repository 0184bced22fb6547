"""reward_server: preference pairs (``prefs``), the frozen-backbone reward model (``model``,
``features``, ``train``) and its HTTP service (``protocol``, ``service``, ``server``, ``client``,
``rules``). See docs/reward.md. Nothing heavy is imported here."""
