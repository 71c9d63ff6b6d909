"""The frontend's one internal error: a graph that is not a decoder it understands.

Raised by every recogniser (``onnx_graph`` and the modules reading a graph
through it, ``quant_codes``) and turned into an InputError naming the file
by ``onnx_import``.
"""


class PatternError(Exception):
    """The graph is not a decoder this frontend understands (turned into InputError)."""
