"""Replanning a model already training: least movement within a budget, and the proven floor of
what a budget allows."""
