"""Expert parallelism (``--ep N``) for mixture-of-experts models, as Megatron-Core runs it with
parallel folding (``--expert-model-parallel-size``, ``--moe-token-dispatcher-type``).

- :mod:`~triosim.graph.expert.plan`: what one expert rank holds and runs (1/N of the experts,
  the grouped GEMMs at the busiest rank's load), the grouped GEMMs that exchange tokens, and the
  closed forms of the exchange.
- :mod:`~triosim.graph.expert.dispatch`: the exchanges in the DAG: the dispatch and combine
  all-to-alls (or all-gather / reduce-scatter, or DeepEP's two-level exchange) on the
  expert-parallel group around the grouped GEMMs, and the expert-data-parallel groups.
"""
