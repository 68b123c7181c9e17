"""The plan (`dlrm-scale/plan/v1` JSON, and the inputs it was made for), and make_plan, the one
entry point from specs to a plan through the search."""
