"""`dsctl tune`'s pure core: SLO grammar (slo), search spaces (space), the Optuna driver (search), the load-side
rate search (rate_search), the quality guard (quality), trial records and the Pareto front (pareto)."""
