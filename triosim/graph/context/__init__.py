"""Context parallelism (``--cp N``): the sequence of every sample split over N GPUs, as
Megatron-Core runs it with Transformer Engine's attention (``--context-parallel-size``,
``--cp-comm-type``).

- :mod:`~triosim.graph.context.plan`: what one context-parallel rank runs and holds (every op
  outside attention on 1/N of the tokens, every activation 1/N, the attention's share under
  causal load balancing), the attention ops and the closed forms of the exchange.
- :mod:`~triosim.graph.context.ring`: the attention of one op in the DAG: the ring of key/value
  exchanges overlapped with the partial attentions (``p2p``), or the all-to-alls (``a2a``) or
  the all-gather (``allgather``) around it.
"""
