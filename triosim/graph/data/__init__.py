"""triosim.graph.data."""
