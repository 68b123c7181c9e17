"""What a plan says to a person and to other tools: the summary and chart, explain, diff, a plan
priced under any cost model, its comm volume."""
