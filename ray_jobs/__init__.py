"""ray_jobs package."""
