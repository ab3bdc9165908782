"""The engine core: the output types that carry a step's masks from the scheduler to the
front end (`outputs`)."""
