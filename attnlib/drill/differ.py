"""The drill's words for what differs: the exercises' one describer, attnlib.exercises._describe."""

from attnlib.exercises._describe import differences, spans

__all__ = ["differences", "spans"]
