"""triosim.graph.collectives.algorithms."""
