"""triosim.compute."""
