"""Settings every tier shares."""

# celpy raises the interpreter's recursion limit (1000 to 2500) the first time it is imported. Validation imports
# it lazily, so without this the first CEL validation of a run could fall inside a hypothesis test, and hypothesis
# refuses a recursion limit changed mid-test ("The recursion limit will not be reset"). Importing it here, before
# any test runs, keeps the limit stable for the whole session.
import specserving.api.cel  # noqa: F401
