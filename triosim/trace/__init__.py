"""triosim.trace.load."""
