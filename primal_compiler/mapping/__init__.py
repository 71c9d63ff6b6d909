"""Mapping machinery shared by the placement passes: tiling, traffic, cost, search."""
