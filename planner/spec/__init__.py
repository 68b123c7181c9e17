"""What the planner is given: tables, cluster, training, tiering, access statistics and the user's
constraints, read from YAML, CSV and JSON; frozen, validated, one-line errors. The lowest layer."""
