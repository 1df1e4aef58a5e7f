"""Inference services: the service schema, per-host instance planning and the one renderer of their files."""
