"""triosim.hardware."""
