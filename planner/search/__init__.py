"""Finding a plan: every table's candidate options, greedy packing, the CP-SAT models, the
configuration LP bound, repair and phase balancing. Imports specs and costs."""
