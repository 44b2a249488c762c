"""triosim.schedule."""
