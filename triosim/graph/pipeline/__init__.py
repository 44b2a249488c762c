"""triosim.graph.pipeline."""
