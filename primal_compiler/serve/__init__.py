"""Serving: a request trace over several adapters, replayed on compiled shapes (:mod:`.costs`) and simulated
request by request (:mod:`.sim`); ``primal serve`` and ``primal trace`` (:mod:`.command`, docs/serving.md)."""
