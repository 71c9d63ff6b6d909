"""Thermal behaviour of a replayed program: a compact RC model of the package (:mod:`.network`) driven by
every CT's replayed power (:mod:`.drive`), the report ``primal thermal`` prints (:mod:`.report`), and the
SAR ADCs' offset drift with die temperature (:mod:`.adc`) that the hardware-precision functional replay
applies (docs/thermal.md)."""

PHASES = ("decode", "prefill")  # the replay windows a thermal report drives the package with
