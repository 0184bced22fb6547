"""reward_server: the frozen-backbone reward model (``model``, ``features``, ``train``) and its HTTP
service (``protocol``, ``service``, ``server``, ``client``, ``rules``). The preference-pair schema it
trains on is the core's (``escrag.pairs``). See docs/reward.md. Nothing heavy is imported here."""
