"""What an option costs: the cost model's formulas (one per term, with its assumptions), the step
as the collectives make it, and the memory check. Imports the specs only."""
