"""triosim.graph.memory.plan."""
