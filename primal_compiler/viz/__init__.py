"""Pictures of a compiled PRIMAL program: placement maps, link traffic, hops, power, breakdowns, trace, HTML.

``primal viz OUT`` (:mod:`.command`) replays a compile output directory and
writes every picture plus ``report.html`` and ``trace.json``; each module
draws one concern from the shared :class:`.data.VizData` (see docs/viz.md).
"""
