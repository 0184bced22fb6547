"""reward_server package."""
