"""triosim.graph.tensor."""
