"""Errors a user can cause. Each carries one line that names the thing and the fix."""


class PlannerError(Exception):
    """Base class: the message is a single line meant for the terminal."""


class ConfigError(PlannerError):
    """A config, table file or hardware profile is missing or invalid."""


class InfeasiblePlanError(PlannerError):
    """No placement satisfies every memory capacity. `table`, when known, is the table that
    found no room (the planner may split it and try again)."""

    def __init__(self, message: str, table: str | None = None) -> None:
        super().__init__(message)
        self.table = table


class PlanFormatError(PlannerError):
    """A plan JSON does not follow dlrm-scale/plan/v1 or does not match the model."""


class PlannerBugError(Exception):
    """The planner produced something it promised never to (a plan that overfills a tier).
    Not a PlannerError: no user input causes it, so it is reported as a bug (exit 3)."""
